"""Control flow and data flow within one file, asked by the rewrites and the rules (no rewrite of its own).

- ``control``: the control-flow graph of a function's statements (branches, loops, ``try``,
  jumps, exceptions), and whether every way from one statement reaches another within one
  iteration of a loop, or may pass a third on the way (a step after a gradient read; a second
  backward pass before it).
- ``bindings``: where a name is bound in a function, class or module, the names each binding
  binds and what each part of it gives them (``a, b = x, y``; ``for k, v in d.items()``): the
  value the migration reads, and the source the linter's step values follow.
- ``reaching``: which bindings of a name reach a statement through the control-flow graph, and
  whether what it held when the function began may: the construction an optimizer at a call is
  (the migration), the binding a read of a step value sees (the linter).
- ``receivers``: where a value handed on (``f(amp=amp)``, ``self.amp = amp``) is used: the
  parameter of the same-file function that takes it, or the attribute, followed to every read;
  each read classified, so that a rewrite knows whether what receives a replacement can take it.
"""
