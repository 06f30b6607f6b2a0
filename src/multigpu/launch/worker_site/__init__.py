"""The directory ``multigpu run`` puts first on ``PYTHONPATH`` of CPU workers, for its
``sitecustomize`` (see there); nothing to import from here."""
