"""apex's optimization levels O0-O3 and the validated option set (``apex.amp.frontend``).

``Properties`` holds the seven options that ``amp.initialize`` prints. Assigning an option goes
through apex's checks: a contradiction (e.g. ``keep_batchnorm_fp32`` with O1) is a RuntimeError,
or, when ``_amp_state.hard_override`` is set, a printed warning.
"""
from __future__ import annotations

import torch

from ampshim.scaler import checked_scale
from ampshim.state import _amp_state

__all__ = ["Properties", "opt_levels", "O0", "O1", "O2", "O3", "_amp_state"]

# Print order of `amp.initialize`, and the values before any level is applied.
_BASE_OPTIONS = (
    ("enabled", False),
    ("opt_level", None),
    ("cast_model_type", None),
    ("patch_torch_functions", False),
    ("keep_batchnorm_fp32", None),
    ("master_weights", None),
    ("loss_scale", 1.0),
)


def _warn_or_err(msg):
    if _amp_state.hard_override:
        print("Warning:  " + msg)
    else:
        raise RuntimeError(msg)


class Properties:
    """The options of one ``amp.initialize`` call, readable as attributes.

    ``Properties().options`` is an ordered dict in apex's print order; every assignment to a known
    option is validated against the current ``opt_level`` (apex's rules, apex's messages).
    """

    def __init__(self):
        self.options = dict(_BASE_OPTIONS)

    def _update_options_dict(self, new_options):
        for name, value in new_options.items():
            if name not in self.options:
                raise ValueError(f"Tried to set unexpected option {name!r}; known options are "
                                 f"{list(self.options)!r}.")
            self.options[name] = value

    def __getattr__(self, name):
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        options = self.__dict__.get("options")
        if options is None or name not in options:
            super().__setattr__(name, value)
            return
        check = getattr(self, "_check_" + name, None)
        options[name] = check(value) if check is not None else value

    def _check_cast_model_type(self, value):
        harmless = value is None or value is False or value is torch.float32
        if self.opt_level == "O1" and not harmless:
            _warn_or_err(
                "O1 inserts casts around Torch functions rather than model weights, so with O1, "
                "the model weights themselves should remain FP32. If you wish to cast the model "
                "to a different type, use opt_level='O2' or 'O3'. "
                "cast_model_type was {}".format(value))
        return value

    def _check_patch_torch_functions(self, value):
        if self.opt_level != "O1" and value:
            _warn_or_err("Currently, patch_torch_functions=True should only be set by selecting "
                         "opt_level='O1'.")
        return value

    def _check_keep_batchnorm_fp32(self, value):
        # apex accepted the strings "True"/"False" (argparse); anything else is a mistake.
        value = {"True": True, "False": False}.get(value, value) if isinstance(value, str) else value
        if value is not True and value is not False and value is not None:
            raise ValueError(
                "keep_batchnorm_fp32 must be True, False, None or the string 'True' or 'False', "
                f"got keep_batchnorm_fp32={value!r}.")
        if self.opt_level == "O1" and value is not None:
            _warn_or_err("With opt_level O1, batchnorm functions are automatically patched to run "
                         "in FP32, so keep_batchnorm_fp32 should be None."
                         " keep_batchnorm_fp32 was {}".format(value))
        return value

    def _check_master_weights(self, value):
        if self.opt_level == "O1" and value is not None:
            _warn_or_err("It doesn't make sense to use master_weights with O1. "
                         "With O1, your model weights themselves should be FP32.")
        return value

    def _check_loss_scale(self, value):
        if value == "dynamic":
            return value
        return checked_scale(value, "loss_scale")


class _OptLevel:
    """One row of apex's defaults table; calling it applies the row to a ``Properties``."""

    brief = ""
    more = ""
    defaults: dict = {}

    def __call__(self, properties):
        properties.enabled = True
        properties.opt_level = self.name
        for name, value in self.defaults.items():
            properties.options[name] = value  # defaults are consistent: no validation needed
        return properties

    @property
    def name(self):
        return type(self).__name__


class O0(_OptLevel):
    brief = "O0:  Pure FP32 training.\n"
    more = "Calls .float() on your model, converting it to FP32, and casts inputs to FP32.\n"
    defaults = dict(cast_model_type=torch.float32, patch_torch_functions=False,
                    keep_batchnorm_fp32=None, master_weights=False, loss_scale=1.0)


class O1(_OptLevel):
    brief = "O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"
    more = ("Model weights stay FP32; operations run under autocast in half precision where "
            "that is safe and in FP32 where it is not. Dynamic loss scaling is used.\n")
    defaults = dict(cast_model_type=None, patch_torch_functions=True,
                    keep_batchnorm_fp32=None, master_weights=None, loss_scale="dynamic")


class O2(_OptLevel):
    brief = "O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n"
    more = ("Casts the model to half precision except affine batchnorm, keeps FP32 master "
            "weights in the optimizer, and uses dynamic loss scaling.\n")
    defaults = dict(cast_model_type=torch.float16, patch_torch_functions=False,
                    keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic")


class O3(_OptLevel):
    brief = "O3:  Pure FP16 training."
    more = ("Casts the whole model to half precision with a static loss scale of 1.0; a speed "
            "baseline, usually not stable enough to converge.\n")
    defaults = dict(cast_model_type=torch.float16, patch_torch_functions=False,
                    keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0)


opt_levels = {"O3": O3(), "O2": O2(), "O1": O1(), "O0": O0()}
