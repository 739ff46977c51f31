"""AMP002: ``amp.initialize`` -> a ``torch.amp.GradScaler`` and ``torch.autocast`` around the forward pass."""
from __future__ import annotations

from migrate.rule import Invalid, Valid
from migrate.rules._apex_planned import PlannedApexRule


class AmpInitialize(PlannedApexRule):
    """What it does:
    Replaces ``model, optimizer = amp.initialize(model, optimizer, opt_level="O1")`` with
    ``scaler = torch.amp.GradScaler("cuda")`` (``self.scaler`` when the targets are attributes;
    another name when ``scaler`` is taken), and wraps the statements from the model's forward call
    up to the loss that goes into ``amp.scale_loss`` in
    ``with torch.autocast("cuda", dtype=torch.float16):``. ``enabled=`` (and an ``if flag:`` around
    the call, which the scaler creation moves out of) becomes ``GradScaler(enabled=...)`` and
    ``torch.autocast(..., enabled=scaler.is_enabled())``; a numeric (static) ``loss_scale`` becomes
    ``init_scale`` with a growth interval no run reaches, so the scale stays where apex kept it.
    O0 is plain fp32: the call goes, nothing is added.

    Why is this bad?
    apex's ``amp`` was removed from apex; native ``torch.amp`` is the supported way to train in
    mixed precision, and O1 (patched casts + dynamic loss scaling) is exactly autocast + GradScaler.

    Fix safety:
    Safe for a literal or default O1 (or O0) when the forward call sits next to ``amp.scale_loss``.
    Safe too for an opt level computed at run time from names, attributes and operators
    (``opt_level=args.opt_level``, ``"O%d" % args.amp``): ``GradScaler(enabled=level != "O0")`` keeps O0 and O1 exact,
    and a check added before it stops an O2/O3 run with a clear error, so no run silently trains
    differently. Likewise a ``loss_scale`` known only at run time (``loss_scale=args.loss_scale``)
    under O0/O1: dynamic (or unset) keeps its meaning, a static value stops with an error. A
    numeric static ``loss_scale`` is safe: the scale never grows, and the only runs that differ
    are those where gradients overflow, which apex stepped with inf/NaN (ruining the weights) and
    GradScaler skips; a ``min_loss_scale`` beside it never applied and is dropped. The invalid
    ``opt_level='01'`` (apex refused it, so no working run changes) is read as O1, and the fix
    says so.
    Options apex only applies under O2/O3 (``keep_batchnorm_fp32``, ``master_weights``,
    ``cast_model_type``) are dropped there. A floor or cap of a dynamic scale given as a number
    (``min_loss_scale=1.0``, ``max_loss_scale=512.0``) is kept: after each ``scaler.update()``,
    ``scaler.update(min(max(scaler.get_scale(), 1.0), 512.0))`` (GradScaler has neither bound),
    and a cap under 2**16 is also where the scaler starts, as apex's did.
    With ``amp.scale_loss`` in another file that imports this one or is imported by it, both
    given to one run, the call goes and that file makes the GradScaler with these options; this
    file imports it for ``amp.state_dict``. Safe when the call runs unconditionally with a literal
    opt level and static options; the pair shares its safety, so a run fixes both or neither.
    Given alone, either half is unsafe and its reason names the other half's file.
    When the module itself is handed on (``model.amp = amp``, ``train(..., amp=amp)``), the
    GradScaler is handed on in its place, and ``scale_loss``/``master_params`` called on what
    receives it (a parameter or attribute of that name) become the scaler's: unsafe, as the
    receivers are found by name.
    Unsafe when the rewrite may change numbers: O2/O3 (fp16 weights and fp32 master copies become
    fp32 weights under autocast); an opt level computed by a call, or one the file shows may be
    O2/O3 (O2/O3 become O1); a floor or cap known only at run time, beside a ``loss_scale`` chosen
    at run time, or a floor above the cap (GradScaler has neither bound); a ``loss_scale`` that
    is neither a number nor a name; several losses or ``initialize`` calls sharing one scaler; an
    autocast region that could only be guessed; a model readied for inference only (no
    optimizers), unless the training ``initialize`` of its function, with the same options, runs
    under every test it runs under (O1's casts are then already global: the call just goes); and
    the two halves of a split file given alone: with ``scale_loss`` but no ``initialize`` the file
    gets its own module-level scaler with apex's defaults, and with ``initialize`` but no
    ``scale_loss`` the call is removed (migrate both files together). Reported without a fix when the file cannot be rewritten consistently (``amp`` handed
    to other code, apex internals, ``**kwargs``, an invalid opt level, an ``initialize`` in a block
    its scaler's users are not in); the message says why. Applied together with AMP003-AMP005.

    Options:
    ``opt-level`` (in ``[tool.ampmigrate.settings]``): set it to ``"O1"`` when every opt level the
    project computes at run time (``opt_level=args.opt_level``) is O0 or O1; those rewrites,
    exact for both, are then safe. ``o2-as-autocast`` (``true``): accept apex O2 rewritten as
    autocast with fp32 weights and no master copies (what most migrations want); O2, literal or
    computed, is then rewritten safely, and only O3 stops a run. Applies to AMP002-AMP005.
    """

    CODE = "AMP002"
    FIX = 'amp.initialize -> a GradScaler, and autocast around the forward'
    MESSAGE = "`amp.initialize` is apex mixed precision"
    VALID = [
        Valid('import torch\nscaler = torch.amp.GradScaler("cuda")\n'),
        Valid("def initialize(model, optimizer, opt_level):\n    return model, optimizer\n\nmodel, optimizer = initialize(model, optimizer, opt_level='O1')\n"),
    ]
    INVALID = [
        Invalid(
            """from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    optimizer.zero_grad()
    out = model(x)
    loss = criterion(out, y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
""",
            """import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
        loss = criterion(out, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        ),
        Invalid(
            """import apex

class Trainer:
    def __init__(self, model, optimizer, args):
        self.model, self.optimizer = apex.amp.initialize(model, optimizer, opt_level="O2", loss_scale=128.0)

    def step(self, batch):
        loss = self.model(batch).mean()
        with apex.amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
        self.optimizer.step()
""",
            """import torch

class Trainer:
    def __init__(self, model, optimizer, args):
        # TODO(ampmigrate): review, this rewrite is unsafe: O2 keeps fp16 weights with
        #   fp32 master copies, where native autocast keeps fp32 weights, like O1
        #   (`o2-as-autocast = true` in [tool.ampmigrate.settings] accepts that)
        self.scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)
        self.model, self.optimizer = model, optimizer

    def step(self, batch):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(batch).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
""",
            unsafe_fixes=True,
        ),
        Invalid(
            """from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, **amp_args)
"""
        ),
    ]
