"""Files and their formats: what a job writes to disk and reads back.

- ``checkpoint.py``       safetensors shards + a signed manifest, atomic writes, verified before use
- ``safetensors_io.py``   safetensors read and write over ``protocol/``'s tensor frames (child processes only:
                          it imports torch)
- ``safetensors_image.py`` the safetensors byte layout, torch-free: ``save_bytes`` writes through it, the daemon
                          reads headers and rebuilds images with it
- ``outer_witness.py``    the DiLoCo witness (outer anchor and momentum), alike from a worker's tensors and, without
                          torch, from a checkpoint shard's bytes
"""
