"""One analysis per file of how it uses ``apex.amp``, shared by the AMP002-AMP005 rewrites.

``amp.initialize``, ``amp.scale_loss``, ``amp.master_params`` and ``amp.state_dict`` only make
sense together: a ``scaler.scale(loss)`` needs the ``scaler`` that replaces ``initialize``, and a
``scaler.step(opt)`` must replace the ``opt.step()`` that follows. So the file is planned as a
whole: either every such site gets a consistent fix (all with the same safety, so that a run
applies all of them or none), or every site is reported with the reason, and nothing is
half-rewritten. The rules read the plan through ``ApexPlanProvider`` (a libcst metadata
provider), which runs once per file however many rules ask for it.

Where each concept lives (each module imports only those before it in this list's order of
dependence: no import cycle):

- ``vocabulary``: the plan (``ApexPlan``), the sites (``InitializeSite``, ``ScaleLossSite``), what
  the plan decides before writing (``Setup``, frozen), why a file cannot be planned
  (``Unplannable``), constants, and code-text helpers.
- ``syntax``: small questions about a statement (does it bind the loss, call backward, hold a
  ``yield``).
- ``unbound``: the reads of an ``amp`` that no binding reaches, where an apex-only call goes
  through it (its import local to another function, or commented out): ``FileTree`` takes them
  as apex references, and ``Draft`` starts with why that is unsafe.
- ``model_names``: the names code gives the initialized models (aliases, the elements of a
  list of them, wrappers), which ``tree`` asks.
- ``tree``: ``FileTree``, the one walk that collects parents, names and apex references, then
  where a statement sits (its block, function, class, loop, branch) and whether it runs the
  model, directly or through a helper of the file; the control-flow graph of each function
  (``migrate.flow.control``, the one AMP101 asks too) for what follows what within an
  iteration and what never runs together. Built once, only read after.
- ``draft``: ``Draft``, the rewrite being written: replacements, lines put before statements,
  why it is unsafe, and the last steps that compose them. The only thing planning changes.
- ``context``: ``Sites`` (the classified references), ``Context`` (tree, sites, setup, draft) and
  ``Step``, the base of each family of planning steps below.
- ``classify``: the references sorted into ``Sites`` once: the API's calls (also on what
  received the module), the module handed on, statements that only touch apex's module.
- Families of planning steps, each an object given a ``Context``, reading the tree, the sites
  and the ``Setup`` and writing the ``Draft``:
  ``stand_ins`` (the disabled GradScaler that stands in until the code making it has run),
  ``initialize`` (the GradScaler and where it is made; ``scaler_options``: its arguments for
  apex's options, and the floor and cap apex kept the scale within, kept after each update;
  ``module_fallbacks``: an ``else: amp = None`` beside it that nothing reads once rewritten),
  ``per_loss`` (apex's per-loss scalers, ``loss_id``: one GradScaler per loss id where each
  optimizer takes one loss id's gradients, else one for all, unsafely),
  ``several_initialize`` (which of several ``initialize`` calls makes the scaler, and what the
  others are: a repeat, models joined to it, an inference-only copy),
  ``conditions`` (the test a scaled backward ran under, said again at its step),
  ``gradients`` (gradients read before the step: ``unscale_`` or a scale-aware clip; reads out
  of the function's sight, ``hidden_readers``: a helper, a closure, an object of the file's class
  or one made with the model;
  ``master_params``; ``optimizer_params``: the model's ``parameters()`` where the
  optimizer holds exactly them; ``scaled_readers``: reads inside ``amp.scale_loss``, kept scaled,
  unsafe where earlier backward passes' gradients are there too), ``steps`` (``scale_loss`` and the optimizer steps after it; ``delay_flags``: a local
  that only fed its ``delay_unscale``, gone with it;
  ``step_sites``: where an optimizer steps, in a statement, the file, or the callers handing a
  function the optimizer it scales for; ``late_backwards``: a plain backward pass after the
  step, safe where a ``zero_grad()`` clears it on every way to the next step, or where its loss
  comes only from a network built apart from the models and their detached outputs;
  ``native_scalings``: a plain backward pass whose loss the file's own GradScaler scaled;
  ``gradient_guards``: the update after a test of the gradients read that skips the step
  (``if math.isfinite(norm):``), or before each arm's ``return``;
  ``fresh_losses``: a scaled loss that is only ever a new tensor, left on apex),
  ``autocast`` (the region around the forward pass; where a caller of the file hands in what a
  forward pass made, a region of its own around that forward; unsafe where the caller is in
  another file, ``migrate.forward_callers``; ``loss_slice``: the statements that compute what
  the loss is made from, and what an arm carries on from above its ``if``; ``earlier_regions``: a
  loss computed inside a region already planned; ``own_autocast``: the file's own autocast that
  holds the step, widened rather than nested in; ``attribute_forwards``: a loss computed from
  ``self.x`` that another method sets by a forward pass: once every region is planned, that
  method's forward passes under an autocast of their own, unless each call of it is in one), ``inference_tail`` (an O1 ``initialize`` for
  inference, or the unused legacy ``amp.init()`` handle of a script with nothing else of apex amp:
  the lines after it under autocast, or, where it ends one arm of ``if args.do_train:``, the arms
  of a later ``if`` on that test that run on its way; ``unused_optimizers``: an ``initialize`` given optimizers
  nothing uses after it, which readied its models for inference only), ``detached_forwards`` (passes without gradients
  in the training loop under autocast too, evaluations whose result steers it, ``steering``, and
  those fed float16 tensors, ``half_inputs``; a method of the class running its model whose result a
  loop of the project hands back to the training, ``migrate.loop_feeds``), ``warm_ups`` (a
  backward pass whose gradients are cleared right after it: its forward pass under autocast),
  ``version_gated`` (apex arms that run only on a torch older than native amp: removed),
  ``checkpoints`` (``state_dict``/``load_state_dict``; a checkpoint utility's functions take the
  GradScaler as ``scaler=None``, without a doubt where every caller passes it,
  ``migrate.state_helpers``, and not at all where the project keeps an ``amp.initialize`` on
  apex, ``migrate.apex_kept``), ``handed_on`` (the amp module passed
  to a function or kept on an object, and what receives it), ``scaler_parameters`` (the GradScaler
  handed to the functions using it, ``train(..., scaler=scaler)``, instead of a module global, and
  to another file's checkpoint helpers, ``save_checkpoint(..., scaler=scaler)``), ``module_reads`` (apex's
  module touched directly: its internals' loss scale, ``amp.__dict__`` probes, an unused legacy
  ``amp.init()`` handle, a log line naming apex), ``cross_file`` (a file holding one half
  of apex amp, planned with the facts of the other half, ``migrate.halves``, ``migrate.half_partners``;
  ``handed_across``: where ``initialize`` has options known at run time, the GradScaler made in
  its half and handed to the other half's training function, ``train_epoch(..., scaler=scaler)``;
  an O3 model for inference becomes ``model.half()``, without a doubt where its ``forward`` is
  never called, ``migrate.forwardless_models``),
  and ``after_imports`` (the definitions a rewrite adds at module level, after the last import).
- ``planner``: the ``Planner``: classifies, reads the sites, decides the ``Setup`` once, then runs
  the families' steps in order and emits the findings. A file is not planned where the project
  keeps apex's ``amp.scale_loss`` in a module linked to it by an import, or another file
  initializes apex and calls what scales its losses (``migrate.scale_kept``), or where it
  initializes in arms that exclude each other. A computed opt level is unsafe where the project
  sets its option to O2/O3 in another file (``migrate.level_settings``). ``kept_elsewhere``: why
  what other files keep on apex (cast lists, cast decorators) makes a rewrite here unsafe.
- ``report_only``: the findings of a file that cannot be planned, each call with the reason;
  ``half_model``: a model the file casts to float16 itself, which stops the plan.
- ``provider``: ``ApexPlanProvider``, the plan as metadata the rules read.
"""
from migrate.apex_plan.provider import ApexPlanProvider, plan_of
from migrate.apex_plan.vocabulary import (
    ACCEPT_O2,
    CAST_API,
    COMPUTED_LEVEL,
    CORE,
    HELPER_NAME,
    HELPER_SOURCE,
    MANUAL_STEP_MARKER,
    MASTER_COPIES,
    ApexPlan,
)

__all__ = [
    "ACCEPT_O2",
    "CAST_API",
    "COMPUTED_LEVEL",
    "CORE",
    "HELPER_NAME",
    "HELPER_SOURCE",
    "MANUAL_STEP_MARKER",
    "MASTER_COPIES",
    "ApexPlan",
    "ApexPlanProvider",
    "plan_of",
]
