"""The training-step model: what a file's training steps do, in order, for the lint rules to query.

Map of the package:

- ``events``: the records. An ``Event`` (a backward pass, a step, a ``.item()``...) with its
  ``frames``: the loops, ``if`` arms, autocast regions, ``try`` bodies and helper calls around it.
- ``vocabulary``: the words. Which calls create a GradScaler or an autocast region, which
  names are optimizers, which reads see gradients, what a flag test is.
- ``build``: the walk of one function in execution order, entering the file's own helpers
  (``self.optimizer_step()``), so a step split across methods reads as one; it records each
  binding (assignments, loop and comprehension targets, a helper's parameters and returns).
- ``imported_helpers``: what the functions of the project's other files read on the host, found
  from the file's imports, for the calls the walk cannot enter.
- ``shapes``: shapes of code the walk recognises (a retry loop, what a chain of calls pulls).
- ``values``: which values are the step's tensors, a def-use pass over the walk's bindings,
  each plain name in the function that binds it.
- ``value_syntax``: what a binding's syntax says (the pairs it binds, the names a loss is taken
  through, whether a call computes something).
- ``model``: ``StepModel`` and the queries: the training loop around an event, whether two
  events share an iteration or never run together, logging guards, the step's tensors.
- ``provider``: ``StepModelProvider``, the libcst metadata provider the rules declare.

The model never imports torch: it reads source only.
"""
from migrate.step_model.events import Arm, Backward, Event, Kind, Loop, Region, Via
from migrate.step_model.model import StepModel, Steps, scaler_off_where
from migrate.step_model.provider import StepModelProvider, model_of

__all__ = ["Arm", "Backward", "Event", "Kind", "Loop", "Region", "StepModel", "StepModelProvider", "Steps", "Via", "model_of", "scaler_off_where"]
