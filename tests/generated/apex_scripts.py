"""Generated apex training scripts: shape features real code has, each spelled several ways.

``features()`` draws one combination (a Hypothesis strategy); ``script(features)`` writes the
apex O1 script with those features, written for CUDA (run it with ``--device cpu`` on the CPU).
Every script trains a small regression on synthetic data from a fixed seed for ``ITERATIONS``
micro-batches, so ``python -m ampshim compare`` can hold its rewrites to it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from hypothesis import strategies as st

ITERATIONS = 16
CHECKPOINT_AT = 7  # a step after which every accumulation spelling has just stepped


@dataclass(frozen=True)
class Features:
    loss: str  # inline | helper | method (of the trainer) | arms (assigned in both arms of an if) |
    #            dict (the forward inside a dict of losses, summed on the next line) | arms_backward
    #            (the forward before an if whose arms each compute the loss and run the backward)
    loop: str  # range | while | enumerate
    accumulation: str  # none | delay_unscale | plain (scaled backward each micro-batch, no delay) |
    #                    inner_loop (the micro-batches in a loop of their own, the step after it)
    boundary: str  # how the accumulation boundary is spelled: plus_one | minus_one
    clip: str  # none | master_params | parameters
    clip_at: str  # with accumulation: boundary (before the step) | micro_batch (after each backward)
    flag: str  # none | on | off: initialize and the scaled backward under a flag (a plain
    #            backward else), the flag on or off by default
    import_guard: bool  # `try: from apex import amp` beside a has_apex flag the guard also tests
    inner_fp32: bool  # the model's head runs under its own autocast(enabled=False)
    names: tuple[str, str, str]  # model, optimizer, loss
    holder: str = "function"  # function (the loop in main) | method (of a Trainer holding the model) |
    #                           handed (a Trainer whose `setup` and `train` methods are handed the model and
    #                           the optimizer, which it does not keep)
    amp_via: str = "module"  # module (the global `amp`) | attribute (`self.amp`, None when off) |
    #                          parameter (handed to the training function)
    optimizers: str = "one"  # one | two (a list: initialize, scale_loss and `for o in opts: o.step()`)
    checkpoint: bool = False  # amp.state_dict() saved and loaded back through helpers mid-run
    early_continue: bool = False  # an iteration skipped with `continue` before its forward
    register_half: bool = False  # amp.register_half_function(torch, "einsum"), einsum in the model
    finite_guard: bool = False  # the step only `if math.isfinite(norm)` of a clip's norm (a clip is made)
    overflow: bool = False  # one batch of infinities mid-run: the scale is lowered and the step skipped
    between: str = "none"  # what runs after the clip before the step: none | aux_backward (a second
    #                        scaled backward, of an auxiliary loss) | parameter_loop (a loop over the
    #                        parameters that skips some with `continue`)
    warmup: bool = False  # the first iterations take a plain backward and step, then `continue`
    backward_in: str = "loop"  # loop | helper (a trainer's `backward(loss)` method; for fp32 runs it
    #                            calls `loss.backward()` and returns early) | update (a trainer's
    #                            `backward_from(output, x, y)` computes the loss from the output the loop's
    #                            forward pass made and hands it in, then scales it: apex cast that
    #                            forward pass, a region in the method does not reach it) | function
    #                            (a module-level `scaled_backward(loss, handed_optimizer, mixed)`: the
    #                            optimizer handed in under another name, stepped by the caller) |
    #                            scaled_method (the `scale_loss` body hands the scaled loss to a
    #                            trainer's `apply_backward(scaled)`, which calls its `backward()`) |
    #                            partial (the loop calls `backwards(loss, opt)`, a `functools.partial`
    #                            of a module-level function made before it: binding the flag first by
    #                            position, or by keyword, or, with no flag, the optimizer) | stored (the
    #                            loop calls the trainer's `run_forward(x)`, which sets `self.output`,
    #                            then `backward_stored(x, y)` computes the loss from it and scales it:
    #                            a GAN model's forward() and backward_G())
    flag_copy: bool = False  # a trainer's initialize tests its `use_amp` parameter, training tests
    #                          the copy `self.use_amp` (the same flag under another name)
    flag_via: str = "value"  # with holder=method and a flag: value (the trainer is handed `use_amp`) |
    #                          options (it is handed the parsed `args`, kept as `self.opt`, and tests
    #                          `self.opt.use_amp`, or `opt.use_amp` in __init__ with flag_copy; main
    #                          sets `args.use_amp` before: a pix2pix model's `self.opt.apex`)
    loop_in: str = "main"  # with the global `amp`, where the loop is: main | function (a module-level
    #                        `train(...)` main calls) | defaults (the same, taking a parameter with a
    #                        default, passed by keyword) | closure (a `def train` inside main) | relay
    #                        (main calls `run(...)`, a module-level function that calls `train(...)`)
    initialize_always: bool = False  # with a flag: `initialize` runs either way, the flag only picks
    #                                  the scaled or the plain backward
    alternate: bool = False  # with micro-batches in a loop of their own: on odd steps the whole batch
    #                          in one scaled backward instead, in the other arm of an `if`
    half_evaluation: bool = False  # after training, an evaluation pass casts the model to float16 and
    #                                feeds it float32 batches (apex's casts made that work)
    trainer_init: str = "own"  # with holder=handed, the trainer's __init__: own (a body of its own) |
    #                            base (it only calls its base class's) | none (inherited from the base)
    clip_in: str = "loop"  # where a clip is written: loop | helper (a module-level function called in
    #                        its place) | closure (a function defined in the training function)
    grads_in: str = "none"  # none | local | attribute: an object of a class of the file, made with the
    #                         model and its optimizer (a local, or `self.tracker`), reads the gradients'
    #                         norm before the step and sets the learning rate from it
    import_in: str = "module"  # module | function (`from apex import amp` in the function that
    #                            initializes, with `global amp` after it) | global_first (the same,
    #                            `global amp` first) | guarded (under the flag, in a `try` whose
    #                            `except ImportError` raises, `global amp` after the import)
    level_in_block: bool = False  # with a flag: its block sets `opt_level = "O1"`, which initialize reads
    # with delay_unscale, how it is spelled against the boundary's test: not_flag (`delay_unscale=not
    # boundary`, `if boundary:`) | accumulating (`delay_unscale=accumulating`, `if not accumulating:`) |
    # comparison (`delay_unscale=(step + 1) % ACCUMULATION != 0`, `if (step + 1) % ACCUMULATION == 0:`) |
    # local (the comparison in a local `delay_unscale` that nothing else reads, a comment on apex above it)
    delay_spelling: str = "not_flag"
    #                               (the scaler is then made in the block, a disabled one before)
    forward_via: str = "model"  # model | wrapper: with holder=method, `__init__` keeps `self.runner =
    #                             nn.DataParallel(self.model) if torch.cuda.device_count() > 1 else
    #                             self.model` before initializing, and the loop's forward passes run it
    scale_bounds: str = "none"  # none | floor | cap | both: apex's `min_loss_scale`/`max_loss_scale` (a
    #                             floor at the start scale, which one overflow reaches; a cap under
    #                             2**16, where the scale starts)
    nan_skip: bool = False  # the scaled backward in the `else:` of `if torch.isnan(loss).any():`
    clip_or_norm: bool = False  # with a clip in the loop: `if CLIP_GRAD:` clips, `else:` only measures the
    #                             norm with a module-level `grad_norm(parameters)` (both arms read gradients)
    entry: str = "main"  # main (a `def main()` that `if __name__ == "__main__":` calls) | guard (main's
    #                      body directly under that `if`: its model, optimizer and flags are module globals)
    memory: str = "none"  # none | after | eval_after | before | teacher: a forward pass under
    #                       `torch.no_grad()` fills a memory (the mean prediction) that the next losses'
    #                       targets add: after the step, the same with the model in eval() and the mean
    #                       taken after the block, before the training forward pass, or after the step
    #                       by a teacher (a copy of the model made after initialize, in eval()); reference:
    #                       before the training forward pass, with gradients and detached (`bank =
    #                       model(x).detach().mean()`; with micro-batches, outside their loop's region)
    native_beside: bool = False  # with a flag: where it is off, a native GradScaler of the module
    #                              scales the backward pass (`native_scaler.scale(loss).backward()`,
    #                              in the loop or the trainer's `backward`) and steps the optimizer,
    #                              as trainers offering both paths do
    after_step: str = "none"  # none | cleared | stale | critic | critic_shared: after the step, a penalty on the head's weights
    #                           takes a plain backward and a head optimizer of its own steps it (a second
    #                           loss stepped apart, as a stop-token net is); cleared: the iteration starts
    #                           with the optimizer's zero_grad() (the head optimizer's own after its step),
    #                           stale: nothing clears its gradients on the shared weights before the next
    #                           scaled backward; critic: a discriminator of its own (a network
    #                           and an optimizer made beside the model) takes a plain backward of a
    #                           loss on the model's detached output, which apex O1 cast too;
    #                           critic_shared: the same on an output not detached (the model's
    #                           gradients take it, cleared at the top of the iteration)
    methods_in: str = "class"  # with holder=method: class (one Trainer) | base (`__init__` and the loss and
    #                            backward methods in a `BaseTrainer`, the loop in `Trainer(BaseTrainer)`,
    #                            whose calls `self.backward(loss)` reach the base's method)
    amp_setup: str = "init"  # with holder=method: init (`__init__` initializes) | method (`__init__` calls
    #                          `self.setup_amp()`, under the flag when there is one, and that method does)
    penalty: str = "none"  # none | positional | keywords: the loss adds a gradient penalty on an input
    #                        copy from `torch.autograd.grad(out, x_req, create_graph=True)` (or
    #                        `autograd.grad(outputs=..., inputs=...)[0]`): gradients computed afresh, no
    #                        read of the optimizer's scaled ones
    own_tests: str = "none"  # none | flags | weights | one_always: the loss's scaled backward and an
    #                          auxiliary loss's one after it, each under a test of its own (`if
    #                          TRAIN_MAIN:` / `if TRAIN_AUX:`, or `if WEIGHTS["aux"] > 0:`; one_always:
    #                          the loss's with none), then the gradients' reads and the step once
    local_helper: str = "none"  # none | before | after: a function the loss calls on the forward
    #                             pass's output, defined in the loop body before that pass (reading
    #                             the batch's `y`) or between it and the loss
    own_autocast: str = "none"  # none | forward | step: with native_beside and the flag off, the file's own
    #                             `with torch.autocast("cuda", dtype=torch.float16, enabled=not <flag>)`, the
    #                             native path's region, holds the forward pass and the loss, or those and the
    #                             backward passes' arms too (a Swin-style trainer's)
    setup_in: str = "main"  # with holder=function: main (main initializes) | builder (a module-level
    #                         `build(model, optimizer[, args])` initializes, under its own copy of the
    #                         flag, and returns both; main unpacks them before training: the scaler
    #                         goes back with them, not through a global) | builder_in_with (the same,
    #                         main's call of it inside a `with` block)
    skip_pass: str = "none"  # with backward_in=helper: none | return (the trainer's `backward` counts its
    #                          passes and returns before scaling every third: a bad batch skipped, the
    #                          loop's step then finds no gradients) | arm (the same test around its
    #                          `scale_loss`, the plain fp32 pass before it)

    def label(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in asdict(self).items() if key != "names")


NAMES = st.tuples(st.sampled_from(["model", "net", "network"]),
                  st.sampled_from(["optimizer", "opt", "optim"]),
                  st.sampled_from(["loss", "train_loss", "objective"]))


# the loss is computed in a trainer's method that scales it and hands it back (see Features.backward_in)
HANDING_BACK = ("update", "stored")


def _coherent(f: Features) -> Features:
    """Features that only exist together: ``self.amp`` and a loss method need a trainer."""
    if f.finite_guard and f.clip == "none":
        f = replace(f, clip="parameters")  # the guard tests the norm a clip returns
    if f.finite_guard:
        f = replace(f, clip_at="boundary")
    if f.between != "none":  # after the clip at the boundary, before the step
        f = replace(f, clip="parameters" if f.clip == "none" else f.clip, clip_at="boundary", finite_guard=False)
    if f.between == "aux_backward":
        # both passes of the step overflow: apex halved the scale at each, GradScaler halves it
        # once per skipped step (a difference docs/codemod.md accepts as safe)
        f = replace(f, overflow=False)
    if f.overflow and f.flag != "none":
        f = replace(f, overflow=False)  # an fp32 run would train on infinities: nothing to compare
    if f.holder == "function":
        f = replace(f, amp_via="parameter" if f.amp_via == "attribute" else f.amp_via,
                    loss="helper" if f.loss == "method" else f.loss)
    if f.holder == "handed":  # the module's `amp`, the loss from a module-level helper
        f = replace(f, amp_via="module", loss="helper" if f.loss == "method" else f.loss)
    if f.backward_in == "helper":  # a method of the trainer, on the module's `amp`, no delay to hand on
        f = replace(f, holder="method", amp_via="module",
                    accumulation="plain" if f.accumulation == "delay_unscale" else f.accumulation)
    if f.backward_in in ("function", "partial"):  # a module-level function on the module's `amp`, no delay to hand on
        f = replace(f, amp_via="module", accumulation="plain" if f.accumulation == "delay_unscale" else f.accumulation)
    if f.backward_in == "scaled_method":  # a method of the trainer takes the scaled loss
        f = replace(f, holder="method")
    if f.backward_in in HANDING_BACK:  # the loss is the method's own, from the output handed in
        f = replace(f, holder="method", amp_via="module", loss="inline", warmup=False,
                    accumulation="none" if f.accumulation in ("delay_unscale", "inner_loop") else f.accumulation)
    if f.holder != "method" or f.flag == "none":
        f = replace(f, flag_copy=False, flag_via="value")
    if f.flag_via == "options" and f.names[1] == "opt":  # `opt` names the options
        f = replace(f, names=(f.names[0], "optim", f.names[2]))
    if f.holder != "method" or f.backward_in in HANDING_BACK:
        f = replace(f, forward_via="model")
    if f.holder != "function" or f.amp_via != "module":
        f = replace(f, loop_in="main")
    if f.loss == "arms_backward":  # the warm-up's plain backward needs the loss before the arms
        f = replace(f, warmup=False)
    if f.accumulation == "inner_loop":  # a `continue` there would end the micro-batch, not the step
        f = replace(f, warmup=False)
    else:
        f = replace(f, alternate=False)
    if f.flag == "none" or f.amp_via == "attribute" or f.backward_in in ("helper", "update", "stored") or f.flag_copy:
        f = replace(f, initialize_always=False)  # `self.amp` None and the helper's early return mean the flag is off
    if f.flag != "none" or f.inner_fp32:
        f = replace(f, half_evaluation=False)  # without apex's casts (fp32 runs, an fp32 head) it raised under apex too
    if f.clip == "none" or (f.clip == "master_params" and f.amp_via != "module"):
        f = replace(f, clip_in="loop")  # a helper reads the module's `amp`
    if f.holder != "method" and f.grads_in == "attribute":
        f = replace(f, grads_in="local")
    if f.import_in != "module":  # `amp` is bound once the initializing function runs
        f = replace(f, import_guard=False, register_half=False)
    if f.flag == "none" or f.optimizers != "one" or f.backward_in in ("update", "stored", "function", "partial"):
        f = replace(f, native_beside=False)  # the other arm of the flag, one optimizer it steps
    if f.import_in == "guarded" and (f.flag == "none" or f.initialize_always or f.amp_via != "module"
                                     or f.clip == "master_params" or f.flag_copy):
        f = replace(f, import_in="function")  # apex's `amp` is read where the flag is off
    if f.backward_in != "loop" or f.loss == "arms_backward":
        f = replace(f, nan_skip=False)  # the test sits around the loop's own scaled backward
    if f.import_in != "module":
        f = replace(f, entry="main")  # `global amp` belongs in a function
    if f.clip == "none" or f.clip_in != "loop" or f.finite_guard:
        f = replace(f, clip_or_norm=False)  # the arms replace the loop's own clip line (the guard tests its norm)
    if f.holder != "function" or f.loop_in != "main" or f.amp_via != "module" or f.optimizers != "one" or f.accumulation == "inner_loop":
        f = replace(f, after_step="none")  # the head optimizer is main's own, beside the one it initializes
    if f.after_step in ("cleared", "critic_shared") and f.accumulation != "none":
        # clearing at the top of each micro-batch would undo the accumulation
        f = replace(f, after_step="stale" if f.after_step == "cleared" else "critic")
    if f.after_step.startswith("critic"):
        f = replace(f, overflow=False)  # an infinite batch would leave the critic's weights NaN on both sides
    if f.backward_in != "loop" or f.loss == "arms_backward":
        f = replace(f, own_tests="none")  # the tests sit around the loop's own scaled backward
    if f.own_tests != "none":  # the auxiliary pass is the second scaled backward of the step
        f = replace(f, between="none" if f.between == "aux_backward" else f.between, overflow=False,
                    native_beside=False)
    if f.loss not in ("inline", "arms") or f.backward_in in HANDING_BACK:
        f = replace(f, local_helper="none")  # the loss computed in the loop from the output
    if f.holder != "method":
        f = replace(f, methods_in="class", amp_setup="init")
    if f.amp_setup == "method" and f.import_in == "guarded":
        f = replace(f, import_in="function")  # the method's import is not under a test of its own
    if f.amp_setup == "method" and f.import_in != "module" and f.flag != "none" and not f.initialize_always:
        # `amp` is bound only where the flag holds: nothing reads it outside the flag's arm
        f = replace(f, amp_via="module" if f.amp_via == "parameter" else f.amp_via,
                    clip="parameters" if f.clip == "master_params" else f.clip)
    if f.loss in ("arms", "arms_backward") or f.backward_in in HANDING_BACK:
        f = replace(f, penalty="none")  # added where one line computes the loss
    if not f.native_beside or f.flag != "off" or f.backward_in != "loop" or f.loss not in ("inline", "helper", "dict", "arms"):
        # the native path's own region, the path the default run takes: ampshim's O1 follows an own
        # region that is off where apex's casts did not (docs/compatibility.md), so apex's path is not judged
        f = replace(f, own_autocast="none")
    if f.holder != "function":
        f = replace(f, setup_in="main")
    if f.backward_in != "helper":
        f = replace(f, skip_pass="none")  # the test sits in the trainer's `backward`
    return f


def features():
    return st.builds(
        Features,
        loss=st.sampled_from(["inline", "helper", "method", "arms", "dict", "arms_backward"]),
        loop=st.sampled_from(["range", "while", "enumerate"]),
        accumulation=st.sampled_from(["none", "delay_unscale", "plain", "inner_loop"]),
        boundary=st.sampled_from(["plus_one", "minus_one"]),
        clip=st.sampled_from(["none", "master_params", "parameters"]),
        clip_at=st.sampled_from(["boundary", "micro_batch"]),
        flag=st.sampled_from(["none", "on", "off"]),
        import_guard=st.booleans(),
        inner_fp32=st.booleans(),
        names=NAMES,
        holder=st.sampled_from(["function", "method", "handed"]),
        amp_via=st.sampled_from(["module", "attribute", "parameter"]),
        optimizers=st.sampled_from(["one", "two"]),
        checkpoint=st.booleans(),
        early_continue=st.booleans(),
        register_half=st.booleans(),
        finite_guard=st.booleans(),
        overflow=st.booleans(),
        between=st.sampled_from(["none", "aux_backward", "parameter_loop"]),
        warmup=st.booleans(),
        backward_in=st.sampled_from(["loop", "helper", "update", "stored", "function", "scaled_method", "partial"]),
        trainer_init=st.sampled_from(["own", "base", "none"]),
        flag_copy=st.booleans(),
        flag_via=st.sampled_from(["value", "options"]),
        loop_in=st.sampled_from(["main", "function", "defaults", "closure", "relay"]),
        initialize_always=st.booleans(),
        alternate=st.booleans(),
        half_evaluation=st.booleans(),
        clip_in=st.sampled_from(["loop", "helper", "closure"]),
        grads_in=st.sampled_from(["none", "local", "attribute"]),
        import_in=st.sampled_from(["module", "function", "global_first", "guarded"]),
        native_beside=st.booleans(),
        after_step=st.sampled_from(["none", "cleared", "stale", "critic", "critic_shared"]),
        forward_via=st.sampled_from(["model", "wrapper"]),
        level_in_block=st.booleans(),
        delay_spelling=st.sampled_from(["not_flag", "accumulating", "comparison", "local"]),
        scale_bounds=st.sampled_from(["none", "floor", "cap", "both"]),
        nan_skip=st.booleans(),
        entry=st.sampled_from(["main", "guard"]),
        clip_or_norm=st.booleans(),
        memory=st.sampled_from(["none", "after", "eval_after", "before", "teacher", "reference"]),
        methods_in=st.sampled_from(["class", "base"]),
        amp_setup=st.sampled_from(["init", "method"]),
        penalty=st.sampled_from(["none", "positional", "keywords"]),
        own_tests=st.sampled_from(["none", "flags", "weights", "one_always"]),
        local_helper=st.sampled_from(["none", "before", "after"]),
        own_autocast=st.sampled_from(["none", "forward", "step"]),
        setup_in=st.sampled_from(["main", "builder", "builder_in_with"]),
        skip_pass=st.sampled_from(["none", "return", "arm"]),
    ).map(_coherent)


def _boundary(f: Features) -> tuple[list[str], str, str]:
    """The lines defining the accumulation boundary, ``delay_unscale``'s value and the boundary's test."""
    at = "(step + 1) % ACCUMULATION == 0" if f.boundary == "plus_one" else "step % ACCUMULATION == ACCUMULATION - 1"
    away = "(step + 1) % ACCUMULATION != 0" if f.boundary == "plus_one" else "step % ACCUMULATION != ACCUMULATION - 1"
    if f.accumulation != "delay_unscale" or f.delay_spelling == "not_flag":
        return [f"boundary = {at}"], "not boundary", "boundary"
    if f.delay_spelling == "accumulating":
        return [f"accumulating = {away}"], "accumulating", "not accumulating"
    if f.delay_spelling == "local":  # a local that only feeds delay_unscale
        return ["# apex: the gradients stay scaled until the boundary", f"delay_unscale = {away}"], "delay_unscale", at
    return [], away, at


_SCALED_BACKWARD = '''

def scaled_backward(loss, handed_optimizer, mixed=True):
    if not mixed:
        loss.backward()
        return
    with amp.scale_loss(loss, handed_optimizer) as scaled_loss:
        scaled_loss.backward()
'''


_FLAGGED_BACKWARD = '''

def flagged_backward(mixed, loss, handed_optimizer):
    if mixed:
        with amp.scale_loss(loss, handed_optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
'''


def _partial_binding(f: Features, s: "_Spelling") -> tuple[str, str, str]:
    """For ``backward_in=partial``: the module-level function, the partial of it made before the
    loop, and the loop's call of that partial."""
    _, _, loss = f.names
    if s.mixed and f.loop == "range":  # the flag first, by position
        return _FLAGGED_BACKWARD, f"backwards = functools.partial(flagged_backward, {s.mixed})", f"backwards({loss}, {s.stepped})"
    if s.mixed:
        return _SCALED_BACKWARD, f"backwards = partial(scaled_backward, mixed={s.mixed})", f"backwards({loss}, {s.stepped})"
    return _SCALED_BACKWARD, f"backwards = partial(scaled_backward, handed_optimizer={s.stepped})", f"backwards({loss})"


_HELPER = '''

def compute_loss(model, inputs, targets):
    return F.mse_loss(model(inputs), targets)
'''

_CHECKPOINTS = '''

def save_checkpoint(model, optimizer, amp_state):
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp_state}, buffer)
    buffer.seek(0)
    return buffer


def restore(buffer, model, optimizer, amp=None):
    checkpoint = torch.load(buffer)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if amp is not None:
        amp.load_state_dict(checkpoint["amp"])
'''


_GRAD_NORM_LR = '''

class GradNormLR:
    """Lowers the learning rate where the gradients' norm is large."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.base = [group["lr"] for group in optimizer.param_groups]

    def update(self):
        norm = sum(float(p.grad.pow(2).sum()) for p in self.model.parameters() if p.grad is not None) ** 0.5
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base / max(1.0, norm)
'''


def _clip_helper(f: Features) -> str:
    """The module-level clip a ``clip_in=helper`` script calls."""
    if f.clip_in != "helper":
        return ""
    if f.clip == "master_params":
        return ("\n\ndef clip_grads(optimizer, max_norm):\n"
                "    return torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)\n")
    return ("\n\ndef clip_grads(model, max_norm):\n"
            "    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n")


_HALF_EVALUATION = '''

def evaluate(model, batches):
    model.eval()
    model.half()
    with torch.no_grad():
        print(sum(F.mse_loss(model(inputs).float(), targets).item() for inputs, targets in batches))
'''


def _net(f: Features) -> str:
    hidden = ('torch.einsum("bi,oi->bo", x, self.body[0].weight) + self.body[0].bias'
              if f.register_half else "self.body[0](x)")
    head = ("        with torch.autocast(\"cuda\", enabled=False):\n"
            "            return self.head(hidden.float())\n") if f.inner_fp32 else "        return self.head(hidden)\n"
    return ("\n\nclass Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh())\n"
            "        self.head = nn.Linear(32, 1)\n\n"
            "    def forward(self, x):\n"
            f"        hidden = torch.tanh({hidden})\n" + head)


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [("    " * depth + line) if line else line for line in lines]


class _Spelling:
    """How the training code names what it uses, for the holder and the amp route drawn."""

    def __init__(self, f: Features):
        model, optimizer, _ = f.names
        method = f.holder == "method"
        own = "self." if method else ""
        self.model, self.optimizer = own + model, own + optimizer
        self.forward = "self.runner" if f.forward_via == "wrapper" else self.model  # what the loop's forward passes run
        self.optimizers = own + optimizer + "s"
        self.stepped = self.optimizers if f.optimizers == "two" else self.optimizer
        self.first_optimizer = f"{self.optimizers}[0]" if f.optimizers == "two" else self.optimizer
        self.amp = "self.amp" if f.amp_via == "attribute" else "amp"
        self.tracker = "self.tracker" if f.grads_in == "attribute" else "tracker"
        options = f.flag_via == "options"
        self.use_amp = ("self.opt.use_amp" if options else own + "use_amp") if f.flag != "none" else None
        # with flag_copy, what __init__ tests: its parameter, of which the trainer keeps a copy
        self.init_flag = ("opt.use_amp" if options else "use_amp") if f.flag_copy else self.use_amp
        self.flag_parameter = "opt" if options else "use_amp"  # what the trainer is handed, and keeps
        self.flag_argument = "args" if options else "use_amp"  # what main hands it
        self.flag_set = "args.use_amp" if options else "use_amp"  # what main sets the flag in
        # the condition mixed precision runs under, as the training code tests it
        self.mixed = (f"{self.amp} is not None" if f.amp_via == "attribute" else self.use_amp) if f.flag != "none" else None


def _step_body(f: Features, s: _Spelling) -> list[str]:
    """One iteration, after the batch ``x, y`` is taken."""
    _, _, loss = f.names
    accumulate = f.accumulation != "none"
    inner = f.accumulation == "inner_loop"
    body = ["if step == 5:", *(["    step += 1"] if f.loop == "while" else []), "    continue"] if f.early_continue else []
    if f.after_step in ("cleared", "critic_shared"):
        body.insert(0, f"{s.optimizer}.zero_grad()")
    if f.memory == "before":
        body += ["with torch.no_grad():", f"    bank = {s.forward}(x).mean()"]
    elif f.memory == "reference":  # a pass with gradients, detached: outside an inner loop's region
        body.append(f"bank = {s.forward}(x).detach().mean()")
    if f.memory != "none":
        body.append("y = y + 0.5 * bank")
    steps_body = body
    if inner:  # the micro-batches' forward and backward in a loop of their own
        steps_body += ["batch_x, batch_y = x, y"]
        body = []
    if f.overflow and inner:  # the last micro-batch only: apex lowered the scale at the overflowing
        # backward pass, GradScaler at the update; from an earlier one, the later passes of the
        # step would see apex's lowered scale (a difference docs/codemod.md accepts)
        steps_body += ["if step == 3:", '    batch_x = torch.cat([batch_x[:8], batch_x[8:] * float("inf")])']
    elif f.overflow:
        body += ["if step == 3:", '    x = x * float("inf")']
    forward_from = len(body)
    if f.backward_in == "update":
        body += [f"output = {s.forward}(x)", f"{loss} = self.backward_from(output, x, y)"]
    elif f.backward_in == "stored":
        body += ["self.run_forward(x)", f"{loss} = self.backward_stored(x, y)"]
    elif f.loss == "inline" and f.local_helper == "none":
        body.append(f"{loss} = F.mse_loss({s.forward}(x), y)")
    elif f.loss == "inline":
        body += [*_shaped_output(f, s), f"{loss} = F.mse_loss(shaped(output), y)"]
    elif f.loss == "helper":
        body.append(f"{loss} = compute_loss({s.forward}, x, y)")
    elif f.loss == "method":
        body.append(f"{loss} = self.compute_loss(x, y)")
    elif f.loss == "arms_backward":  # each arm computes the loss, then scales it (below)
        body.append(f"output = {s.forward}(x)")
    elif f.loss == "dict":
        body += [f'{loss}_dict = {{"mse": F.mse_loss({s.forward}(x), y), "l1": 0.1 * F.l1_loss({s.forward}(x), y)}}',
                 f"{loss} = sum({loss}_dict.values())"]
    else:
        output = "shaped(output)" if f.local_helper != "none" else "output"
        body += [*_shaped_output(f, s),
                 "if step % 2 == 0:",
                 f"    {loss} = F.mse_loss({output}, y)",
                 "else:",
                 f"    {loss} = F.smooth_l1_loss({output}, y)"]
    body += _penalty(f, s)
    if accumulate and f.backward_in not in HANDING_BACK and f.loss != "arms_backward":
        body.append(f"{loss} = {loss} / ACCUMULATION")
    if f.own_autocast == "forward":
        body[forward_from:] = _own_region(s, body[forward_from:])
    defined, delayed, at_boundary = _boundary(f)
    if accumulate and not inner:
        body += defined
    if f.warmup:  # a plain step that ends the iteration, before the scaled path
        plain_step = ([f"for {f.names[1]} in {s.optimizers}:", f"    {f.names[1]}.step()", f"    {f.names[1]}.zero_grad()"]
                      if f.optimizers == "two" else [f"{s.optimizer}.step()", f"{s.optimizer}.zero_grad()"])
        body += ["if step < 2:", f"    {loss}.backward()", *_indent(plain_step), f"    losses.append(float({loss}))",
                 *(["    step += 1"] if f.loop == "while" else []), "    continue"]
    delay = f", delay_unscale={delayed}" if f.accumulation == "delay_unscale" else ""
    scaled = [f"with {s.amp}.scale_loss({loss}, {s.stepped}{delay}) as scaled_loss:",
              "    self.apply_backward(scaled_loss)" if f.backward_in == "scaled_method" else "    scaled_loss.backward()"]
    backward_from = len(body)
    if f.backward_in in HANDING_BACK:
        pass  # the method scaled it
    elif f.backward_in == "helper":
        body.append(f"self.backward({loss})")
    elif f.backward_in == "function":  # the flag by position in a `range` loop, else by keyword
        mixed = "" if not s.mixed else f", {s.mixed}" if f.loop == "range" else f", mixed={s.mixed}"
        body.append(f"scaled_backward({loss}, {s.stepped}{mixed})")
    elif f.backward_in == "partial":
        body.append(_partial_binding(f, s)[2])
    elif s.mixed:
        unscaled = f"native_scaler.scale({loss}).backward()" if f.native_beside else f"{loss}.backward()"
        body += _skipping_nan(f, loss, [f"if {s.mixed}:", *_indent(scaled), "else:", f"    {unscaled}"])
    else:
        body += _skipping_nan(f, loss, scaled)
    auxiliary = _own_tests(f, s, backward_from, body, delay)  # puts the loss's pass under its test
    body += auxiliary
    if f.loss == "arms_backward":
        backward, body[backward_from:] = body[backward_from:], []
        divided = " / ACCUMULATION" if accumulate else ""
        # the target cast to the output's dtype (a common spelling): outside autocast the loss then
        # computes in float16, where apex's casts computed it in float32
        body += ["if step % 2 == 0:", f"    {loss} = F.mse_loss(output, y.type_as(output)){divided}", *_indent(backward),
                 "else:", f"    {loss} = F.smooth_l1_loss(output, y){divided}", *_indent(backward)]
    if f.own_autocast == "step":
        body[forward_from:] = _own_region(s, body[forward_from:])
    clip = []
    if f.clip_in == "helper":
        clip.append(f"clip_grads({s.first_optimizer if f.clip == 'master_params' else s.model}, 0.5)")
    elif f.clip_in == "closure":
        clip.append("limit_norm(0.5)")
    elif f.clip in ("master_params", "parameters"):
        # `self.amp` may be None: the module's own master_params serves either way
        holder = "amp" if f.amp_via == "attribute" and s.mixed else s.amp
        params = f"{holder}.master_params({s.first_optimizer})" if f.clip == "master_params" else f"{s.model}.parameters()"
        clip.append(f"torch.nn.utils.clip_grad_norm_({params}, 0.5)")
        if f.clip_or_norm:
            clip = ["if CLIP_GRAD:", f"    norm = {clip[0]}", "else:", f"    norm = grad_norm({params})"]
    at_micro_batch = accumulate and f.clip_at == "micro_batch"
    body += clip if at_micro_batch else []
    if inner:
        micro = ["for x, y in zip(batch_x.chunk(ACCUMULATION), batch_y.chunk(ACCUMULATION)):", *_indent(body)]
        if f.alternate:  # the same lines for the whole batch in the other arm
            micro = ["if step % 2 == 0:", *_indent(micro), "else:", "    x, y = batch_x, batch_y", *_indent(body)]
        body = [*steps_body, *micro]
    tracker = [f"{s.tracker}.update()"] if f.grads_in != "none" else []  # before the clip: a guard tests the clip's norm
    update = tracker + ([] if at_micro_batch else clip + _between(f, s))
    if f.optimizers == "two":
        each = f.names[1]
        stepping = [f"for {each} in {s.optimizers}:", f"    {each}.step()", f"    {each}.zero_grad()"]
        zeroing = [f"for {each} in {s.optimizers}:", f"    {each}.zero_grad()"]
    elif f.native_beside:  # the native path steps through its own scaler
        stepping = [f"if {s.mixed}:", f"    {s.optimizer}.step()", "else:", f"    native_scaler.step({s.optimizer})",
                    "    native_scaler.update()", f"{s.optimizer}.zero_grad()"]
        zeroing = [f"{s.optimizer}.zero_grad()"]
    else:
        stepping = [f"{s.optimizer}.step()", f"{s.optimizer}.zero_grad()"]
        zeroing = [f"{s.optimizer}.zero_grad()"]
    if f.finite_guard:
        update[-1:] = ["norm = " + update[-1]]
        update += ["if math.isfinite(norm):", *_indent(stepping), "else:", *_indent(zeroing)]
    else:
        update += stepping
    body += [f"if {at_boundary}:", *_indent(update)] if accumulate and not inner else update
    if f.after_step.startswith("critic"):  # apex left its backward plain and cast its forward passes
        critic = f"critic_{f.names[1]}"
        fake = f"{s.forward}(x).detach()" if f.after_step == "critic" else f"{s.forward}(x * 0.5)"
        body += [f"fake = {fake}", "critic_out = critic(fake)",
                 "critic_loss = F.binary_cross_entropy_with_logits(critic_out, torch.ones_like(critic_out))",
                 "critic_loss.backward()", f"{critic}.step()", f"{critic}.zero_grad()"]
    elif f.after_step != "none":  # a loss of its own, stepped apart: apex left its gradients unscaled
        head = f"head_{f.names[1]}"
        body += [f'penalty = 0.05 * sum(p.pow(2).sum() for p in {head}.param_groups[0]["params"])',
                 "penalty.backward()", f"{head}.step()", *([f"{head}.zero_grad()"] if f.after_step == "cleared" else [])]
    if f.checkpoint:
        state = f"{s.amp}.state_dict()" + (f" if {s.mixed} else None" if s.mixed else "")
        handed = s.amp + (f" if {s.mixed} else None" if s.mixed and f.amp_via != "attribute" else "")
        body += [f"if step == {CHECKPOINT_AT}:",
                 f"    buffer = save_checkpoint({s.model}, {s.first_optimizer}, {state})",
                 f"    restore(buffer, {s.model}, {s.first_optimizer}, amp={handed})"]
    # kept finite: an overflowing batch (Features.overflow) must not overflow every later one
    if f.memory in ("after", "teacher"):
        network = "teacher" if f.memory == "teacher" else s.forward
        body += ["with torch.no_grad():", f"    bank = torch.nan_to_num({network}(x).mean()).clamp(-1, 1)"]
    elif f.memory == "eval_after":
        body += [f"{s.model}.eval()", "with torch.no_grad():", f"    out = {s.forward}(x)", f"{s.model}.train()",
                 "bank = torch.nan_to_num(out.mean()).clamp(-1, 1)"]
    body.append(f"losses.append(float({loss}))")
    return body


def _own_region(s: _Spelling, lines: list[str]) -> list[str]:
    """``lines`` under the file's own autocast, on where the native path runs (``Features.own_autocast``)."""
    native = f"not {s.mixed}" if " " not in s.mixed else f"not ({s.mixed})"
    return [f'with torch.autocast("cuda", dtype=torch.float16, enabled={native}):', *_indent(lines)]


def _shaped_output(f: Features, s: _Spelling) -> list[str]:
    """The forward pass into ``output``, with the loop body's own ``shaped`` beside it
    (``Features.local_helper``)."""
    forward = [f"output = {s.forward}(x)"]
    if f.local_helper == "before":  # reads the batch the loop took
        return ["def shaped(t):", "    return t[:, :y.size(1)]", *forward]
    if f.local_helper == "after":
        return [*forward, "def shaped(t):", "    return t.reshape(t.size(0), -1)"]
    return forward


_OWN_TESTS = {"flags": ("TRAIN_MAIN", "TRAIN_AUX"), "weights": ('WEIGHTS["main"] > 0', 'WEIGHTS["aux"] > 0'),
              "one_always": (None, 'WEIGHTS["aux"] > 0')}


def _own_tests(f: Features, s: _Spelling, backward_from: int, body: list[str], delay: str) -> list[str]:
    """With ``Features.own_tests``: the loss's backward lines (``body[backward_from:]``) go under
    their test, in place; returns the auxiliary loss's pass under its own."""
    if f.own_tests == "none":
        return []
    main_test, aux_test = _OWN_TESTS[f.own_tests]
    if main_test:
        body[backward_from:] = [f"if {main_test}:", *_indent(body[backward_from:])]
    divided = " / ACCUMULATION" if f.accumulation != "none" else ""
    scaled = [f"with {s.amp}.scale_loss(aux, {s.stepped}{delay}) as scaled_aux:", "    scaled_aux.backward()"]
    aux = [f"aux = 0.01 * {s.forward}(x).pow(2).mean(){divided}",
           *([f"if {s.mixed}:", *_indent(scaled), "else:", "    aux.backward()"] if s.mixed else scaled)]
    return [f"if {aux_test}:", *_indent(aux)]


def _penalty(f: Features, s: _Spelling) -> list[str]:
    """A gradient penalty on an input copy added to the loss (``Features.penalty``)."""
    if f.penalty == "none":
        return []
    _, _, loss = f.names
    taken = ("(input_grad,) = torch.autograd.grad({0}(x_req).sum(), x_req, create_graph=True)"
             if f.penalty == "positional" else
             "input_grad = autograd.grad(outputs={0}(x_req).sum(), inputs=x_req, create_graph=True)[0]")
    return ["x_req = x.detach().requires_grad_(True)", taken.format(s.forward),
            f"{loss} = {loss} + 0.01 * input_grad.pow(2).mean()"]


def _skipping_nan(f: Features, loss: str, backward: list[str]) -> list[str]:
    """The backward pass, in the ``else:`` of a test for a NaN loss where ``Features.nan_skip``."""
    if not f.nan_skip:
        return backward
    return [f"if torch.isnan({loss}).any():", "    pass  # a bad batch: no backward pass", "else:", *_indent(backward)]


def _between(f: Features, s: _Spelling) -> list[str]:
    """What runs after the clip, before the step (``Features.between``)."""
    if f.between == "parameter_loop":
        return ["trainable = 0", f"for p in {s.model}.parameters():", "    if not p.requires_grad:",
                "        continue", "    trainable += 1"]
    if f.between != "aux_backward":
        return []
    scaled = [f"with {s.amp}.scale_loss(aux, {s.stepped}) as scaled_aux:", "    scaled_aux.backward()"]
    aux = [f"aux = 0.01 * {s.model}(x).pow(2).mean()" + (" / ACCUMULATION" if f.accumulation != "none" else "")]
    if s.mixed:
        return aux + [f"if {s.mixed}:", *_indent(scaled), "else:", "    aux.backward()"]
    return aux + scaled


def _loop(f: Features, s: _Spelling) -> list[str]:
    body = _step_body(f, s)
    if f.loop == "range":
        return [f"for step in range({ITERATIONS}):", "    x, y = batches[step % len(batches)]", *_indent(body)]
    if f.loop == "while":
        return ["step = 0", f"while step < {ITERATIONS}:", "    x, y = batches[step % len(batches)]",
                *_indent(body), "    step += 1"]
    return [f"for step, (x, y) in enumerate(batches * {ITERATIONS // 4}):", *_indent(body)]


def _made(f: Features, model: str, optimizer: str) -> list[str]:
    """The model and its optimizer(s)."""
    network = "Net()" if f.inner_fp32 or f.register_half else "nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))"
    lines = [f"{model} = {network}.cuda()"]
    if f.optimizers == "two":
        return lines + [f"params = list({model}.parameters())",
                        f"{optimizer}s = [torch.optim.SGD(params[:2], lr=0.1), torch.optim.SGD(params[2:], lr=0.05)]"]
    head = [f"head_{optimizer} = torch.optim.SGD(list({model}.parameters())[-2:], lr=0.05)"] if f.after_step != "none" else []
    if f.after_step.startswith("critic"):
        head = ["critic = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()",
                f"critic_{optimizer} = torch.optim.SGD(critic.parameters(), lr=0.05)"]
    return lines + [f"{optimizer} = torch.optim.SGD({model}.parameters(), lr=0.1)", *head]


def _initialize(f: Features, s: _Spelling, model: str, optimizer: str) -> list[str]:
    """``amp.initialize``, under the flag when there is one."""
    held = optimizer + ("s" if f.optimizers == "two" else "")
    bounds = {"none": "", "floor": ", min_loss_scale=65536.0", "cap": ", max_loss_scale=2.0**15",
              "both": ", min_loss_scale=32768.0, max_loss_scale=2.0**15"}[f.scale_bounds]
    initialize = f"{model}, {held} = amp.initialize({model}, {held}, opt_level=\"O1\"{bounds}, verbosity=0)"
    flag = s.init_flag if f.holder == "method" else s.use_amp
    lines = [f"if {flag}:", "    " + initialize] if s.use_amp and not f.initialize_always else [initialize]
    if f.level_in_block and len(lines) == 2:  # the block sets the level the call reads
        lines = [lines[0], '    opt_level = "O1"', "    " + initialize.replace('opt_level="O1"', "opt_level=opt_level")]
    return _imported_here(f, lines)


def _unflagged(f: Features, s: _Spelling, set_up: list[str]) -> list[str]:
    """``__init__``'s set-up lines without their flag's test: a method that runs only where it holds."""
    test = f"if {s.init_flag}:"
    if test not in set_up:  # apex's import lines (import_in=function) may come before the test
        return set_up
    at = set_up.index(test)
    return [*set_up[:at], *(line[4:] if line.startswith("    ") else line for line in set_up[at + 1:])]


def _backward_method(f: Features, s: _Spelling) -> list[str]:
    """The trainer's ``backward(loss)``: plain and returning early where mixed precision is off."""
    if f.backward_in in HANDING_BACK:
        divided = " / ACCUMULATION" if f.accumulation != "none" else ""
        plain = [f"if not {s.mixed}:", "    loss.backward()", "    return loss"] if s.mixed else []
        model = s.model  # a second pass of its own too (a discriminator's), under the region
        # stored: the loop's `self.run_forward(x)` keeps the output on the trainer (a GAN model's forward())
        head, output = (["def backward_from(self, output, x, y):"], "output") if f.backward_in == "update" else (
            ["def run_forward(self, x):", f"    self.output = {s.forward}(x)", "", "def backward_stored(self, x, y):"], "self.output")
        return ["", *head,
                *_indent([f"loss = (F.mse_loss({output}, y) + 0.01 * {model}(x).pow(2).mean()){divided}", *plain,
                          f"with amp.scale_loss(loss, {s.stepped}) as scaled_loss:", "    scaled_loss.backward()",
                          "return loss"])]
    if f.backward_in == "scaled_method":
        return ["", "def apply_backward(self, scaled):", "    scaled.backward()"]
    if f.backward_in != "helper":
        return []
    unscaled = "native_scaler.scale(loss).backward()" if f.native_beside else "loss.backward()"
    plain = [f"if not {s.mixed}:", f"    {unscaled}", "    return"] if s.mixed else []
    scaled = [f"with amp.scale_loss(loss, {s.stepped}) as scaled_loss:", "    scaled_loss.backward()"]
    counted = ['self.passes = getattr(self, "passes", 0) + 1']
    if f.skip_pass == "return":
        plain = [*counted, "if self.passes % 3 == 0:", "    return  # a bad batch: no backward pass", *plain]
    elif f.skip_pass == "arm":
        plain, scaled = [*counted, *plain], ["if self.passes % 3 != 0:", *_indent(scaled)]
    return ["", "def backward(self, loss):", *_indent([*plain, *scaled])]


def _training_prelude(f: Features, s: _Spelling) -> list[str]:
    """What the training function sets up before its loop: a local gradient tracker, a clip closure."""
    lines = [f"tracker = GradNormLR({s.model}, {s.first_optimizer})"] if f.grads_in == "local" else []
    if f.memory != "none":
        lines.append("bank = 0.0")
    if f.memory == "teacher":  # apex O1 cast its passes too: torch's functions were patched process-wide
        lines += [f"teacher = copy.deepcopy({s.model})", "teacher.eval()"]
    if f.backward_in == "partial":
        lines.append(_partial_binding(f, s)[1])
    if f.clip_in == "closure":
        read = (f"{s.amp}.master_params({s.first_optimizer})" if f.clip == "master_params"
                else f"{s.model}.parameters()")
        lines += ["", "def limit_norm(max_norm):", f"    return torch.nn.utils.clip_grad_norm_({read}, max_norm)", ""]
    return lines


def _imported_here(f: Features, initialize: list[str]) -> list[str]:
    """``initialize`` with apex's import in the function (``Features.import_in``)."""
    if f.import_in == "function":
        return ["from apex import amp", "global amp", *initialize]
    if f.import_in == "global_first":
        return ["global amp", "from apex import amp", *initialize]
    if f.import_in == "guarded":  # `if flag:` then the block's lines (the level it sets, initialize)
        test, *lines = initialize
        return [test, "    try:", "        from apex import amp", "        global amp", "    except ImportError:",
                '        raise ImportError("mixed precision needs apex")', *lines]
    return initialize


def _data() -> list[str]:
    return ['data = torch.randn(64, 16, device="cuda")',
            "target = data[:, :1].sin() * 3",
            "batches = [(data[i:i + 16], target[i:i + 16]) for i in range(0, 64, 16)]"]


def _main_and_training(f: Features) -> str:
    model, optimizer, _ = f.names
    s = _Spelling(f)
    flag = []
    if f.flag != "none":
        flag = ['parser.add_argument("--no-fp16", dest="fp16", action="store_false")'
                if f.flag == "on" else 'parser.add_argument("--fp16", action="store_true")']
    wanted = "has_apex and args.fp16" if f.import_guard else "args.fp16"
    parse = ["parser = argparse.ArgumentParser()", *flag, "args = parser.parse_args()", "torch.manual_seed(0)"]
    training = [*_training_prelude(f, s), *_loop(f, s), "print(losses[-1])"]
    if f.holder == "method":
        keep = [f"self.{model} = {model}", f"self.{optimizer}{'s' if f.optimizers == 'two' else ''} = "
                f"{optimizer}{'s' if f.optimizers == 'two' else ''}"]
        if f.forward_via == "wrapper":
            keep.append(f"self.runner = nn.DataParallel(self.{model}) if torch.cuda.device_count() > 1 else self.{model}")
        init_flag = [f"self.{s.flag_parameter} = {s.flag_parameter}"] if s.use_amp else []
        set_up = _initialize(f, s, f"self.{model}", f"self.{optimizer}")
        setup_method = []
        if f.amp_setup == "method":  # the same lines in a method `__init__` calls, under the flag
            setup_method = ["", "def setup_amp(self):", *_indent(_unflagged(f, s, set_up))]
            call = ["self.setup_amp()"]
            set_up = [f"if {s.init_flag}:", *_indent(call)] if (
                s.use_amp and not f.initialize_always) else call
        if f.grads_in == "attribute":
            set_up.append(f"self.tracker = GradNormLR({s.model}, {s.first_optimizer})")
        holds = []
        if f.amp_via == "attribute":
            holds = [f"self.amp = amp if {s.use_amp} else None" if s.use_amp else "self.amp = amp"]
        takes = ", amp" if f.amp_via == "parameter" else ""
        loss_method = [] if f.loss != "method" else [
            "", "def compute_loss(self, inputs, targets):", f"    return F.mse_loss(self.{model}(inputs), targets)"]
        made = _made(f, model, optimizer)
        methods = [f"def __init__(self, {model}, {optimizer}{'s' if f.optimizers == 'two' else ''}"
                   f"{', ' + s.flag_parameter if s.use_amp else ''}):",
                   *_indent([*keep, *init_flag, *set_up, *holds]),
                   *setup_method,
                   *loss_method,
                   *_backward_method(f, s)]
        train = [f"def train(self, batches{takes}):", *_indent(["losses = []", *training])]
        if f.methods_in == "base":  # the loop in a subclass, reaching the base's methods through `self`
            trainer = ["class BaseTrainer:", *_indent(methods), "", "",
                       "class Trainer(BaseTrainer):", *_indent(train)]
        else:
            trainer = ["class Trainer:", *_indent([*methods, "", *train])]
        main = [*parse, *([f"{s.flag_set} = {wanted}"] if s.use_amp else []), *made, *_data(),
                f"trainer = Trainer({model}, {optimizer}{'s' if f.optimizers == 'two' else ''}"
                f"{', ' + s.flag_argument if s.use_amp else ''})",
                f"trainer.train(batches{takes})"]
        return "\n".join(trainer) + "\n\n\ndef main():\n" + "\n".join(_indent(main))
    if f.holder == "handed":
        held = f"{optimizer}s" if f.optimizers == "two" else optimizer
        flag_arg = ", use_amp" if s.use_amp else ""
        init = {"own": ["def __init__(self):", "    self.runs = 0", ""],
                "base": ["def __init__(self):", "    super().__init__()", ""], "none": []}[f.trainer_init]
        base = [] if f.trainer_init == "own" else ["class Base:", "    def __init__(self):", "        self.runs = 0", "", ""]
        trainer = [*base, "class Trainer:" if f.trainer_init == "own" else "class Trainer(Base):",
                   *_indent([*init,
                             f"def setup(self, {model}, {held}{flag_arg}):",
                             *_indent([*_initialize(f, s, model, optimizer), f"return {model}, {held}"]),
                             "",
                             f"def train(self, {model}, {held}, batches{flag_arg}):",
                             *_indent(["self.runs += 1", "losses = []", *training])])]
        main = [*parse, *([f"use_amp = {wanted}"] if s.use_amp else []), *_made(f, model, optimizer), *_data(),
                "trainer = Trainer()", f"{model}, {held} = trainer.setup({model}, {held}{flag_arg})",
                f"trainer.train({model}, {held}, batches{flag_arg})"]
        return "\n".join(trainer) + "\n\n\ndef main():\n" + "\n".join(_indent(main))
    initialize, builder = _initialize(f, s, model, optimizer), ""
    if f.setup_in != "main":  # initialized by a function returning what it initialized
        held = f"{optimizer}s" if f.optimizers == "two" else optimizer
        params = f"{model}, {held}{', args' if s.use_amp else ''}"  # it reads the flag from the options
        flag = [f"use_amp = {wanted}"] if s.use_amp else []
        builder = "\n".join([f"def build({params}):", *_indent([*flag, *initialize, f"return {model}, {held}"])]) + "\n\n\n"
        initialize = [f"{model}, {held} = build({params})"]
        if f.setup_in == "builder_in_with":  # a `with` runs its body: the call is as if at main's top
            initialize = ["with torch.autograd.set_detect_anomaly(False):", *_indent(initialize)]
    main = [*parse, *([f"use_amp = {wanted}"] if s.use_amp else []), *_made(f, model, optimizer), *initialize, *_data()]
    if f.amp_via == "parameter":
        held = f"{optimizer}s" if f.optimizers == "two" else optimizer
        params = f"{model}, {held}, batches{', use_amp' if s.use_amp else ''}, amp"
        train = [f"def train({params}):", *_indent(["losses = []", *training])]
        main.append(f"train({params})")
        return builder + "\n".join(train) + "\n\n\ndef main():\n" + "\n".join(_indent(main))
    if f.loop_in != "main":  # the loop in a function of its own, reading the global `amp`
        held = f"{optimizer}s" if f.optimizers == "two" else optimizer
        params = f"{model}, {held}, batches{', use_amp' if s.use_amp else ''}"
        signature, call = params, params
        if f.loop_in == "defaults":
            signature, call = params + ", log_every=0", params + ", log_every=4"
        train = [f"def train({signature}):", *_indent(["losses = []", *training])]
        if f.loop_in == "closure":
            return builder + "def main():\n" + "\n".join(_indent([*main, *train, f"train({call})"]))
        if f.loop_in == "relay":  # main -> run -> train
            relay = [f"def run({params}):", *_indent([f"train({call})"])]
            return (builder + "\n".join(train) + "\n\n\n" + "\n".join(relay) + "\n\n\ndef main():\n"
                    + "\n".join(_indent([*main, f"run({params})"])))
        return builder + "\n".join(train) + "\n\n\ndef main():\n" + "\n".join(_indent([*main, f"train({call})"]))
    main += ["losses = []", *training]
    return builder + "def main():\n" + "\n".join(_indent(main))


def script(f: Features) -> str:
    f = _coherent(f)
    header = f'"""A generated apex script: {f.label()}."""\n'
    imports = "import argparse\n" + ("import copy\n" if f.memory == "teacher" else "") + ("import io\n" if f.checkpoint else "") + ("import math\n" if f.finite_guard else "")
    if f.backward_in == "partial":
        imports += "import functools\nfrom functools import partial\n"
    imports += "\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
    if f.penalty == "keywords":
        imports += "from torch import autograd\n"
    if f.import_guard:
        imports += ("\ntry:\n    from apex import amp\n    has_apex = True\nexcept ImportError:\n"
                    "    has_apex = False\n")
    elif f.import_in == "module":
        imports += "from apex import amp\n"
    if f.register_half:
        register = 'amp.register_half_function(torch, "einsum")\n'
        imports += "\n" + (f"if has_apex:\n    {register}" if f.import_guard else register)
    constants = f"\nACCUMULATION = {2 if f.accumulation != 'none' else 1}\n" if f.accumulation != "none" else ""
    if f.native_beside:
        constants += "\nnative_scaler = torch.cuda.amp.GradScaler()\n"
    if f.own_tests == "flags":
        constants += "\nTRAIN_MAIN = True\nTRAIN_AUX = True\n"
    elif f.own_tests != "none":
        constants += '\nWEIGHTS = {"main": 1.0, "aux": 0.01}\n'
    if f.clip_or_norm:
        constants += ("\nCLIP_GRAD = 0.5\n\n\ndef grad_norm(parameters):\n"
                      "    return torch.norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))\n")
    helpers = ((_HELPER if f.loss == "helper" else "") + (_SCALED_BACKWARD if f.backward_in == "function" else "")
               + (_partial_binding(f, _Spelling(f))[0] if f.backward_in == "partial" else "") + (_net(f) if f.inner_fp32 or f.register_half else "")
               + (_CHECKPOINTS if f.checkpoint else "") + _clip_helper(f) + (_GRAD_NORM_LR if f.grads_in != "none" else ""))
    evaluation = ""
    training = _main_and_training(f)
    if f.half_evaluation:  # main's last line is in main in every layout: the evaluation follows it
        evaluation = _HALF_EVALUATION
        training += f"\n    evaluate({f.names[0]}, batches)"
    if f.entry == "guard":
        return header + imports + constants + helpers + evaluation + "\n\n" + training.replace(
            "def main():\n", 'if __name__ == "__main__":\n', 1) + "\n"
    return (header + imports + constants + helpers + evaluation + "\n\n" + training
            + '\n\n\nif __name__ == "__main__":\n    main()\n')
