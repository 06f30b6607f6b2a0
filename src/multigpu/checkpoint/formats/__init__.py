"""Every checkpoint format behind one protocol (``base.CheckpointFormat``), and the readers of
the formats multigpu did not write.

One implementation per format: ``native_format`` (ours, over ``checkpoint.native``),
``dcp_format`` (a directory written by ``torch.distributed.checkpoint.save``: ``dcp_objects``
reads its index, ``dcp_load`` loads it into a run), ``hub_format`` (safetensors weights in the
Hugging Face layout: ``hub`` reads the files, ``hub_load`` loads them into a run, ``hub_names``
and ``hub_config`` match them to a ``transformers`` model) and ``torch_format`` (a ``torch.save``
file, read safely by ``torch_file``). What they share: ``model_state`` (the model's state dict
in what a file holds), ``keys`` (wrapper prefixes), ``inspection`` (``ckpt inspect``'s rows).
Which format a path is, is ``checkpoint.dispatch``'s alone.
"""
