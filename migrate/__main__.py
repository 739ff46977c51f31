"""``python -m migrate``: the ``ampmigrate`` command."""
from migrate.cli import main

main(prog_name="ampmigrate")
