"""Built-in example jobs (``multigpu train`` runs ``multigpu.examples.digits``)."""
