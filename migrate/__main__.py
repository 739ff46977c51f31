"""``python -m migrate``: the ``ampmigrate`` command."""
from migrate.cli import run

run()
