"""Files and their formats: what a job writes to disk and reads back.

- ``checkpoint.py``       safetensors shards + a signed manifest, atomic writes, verified before use
- ``safetensors_io.py``   safetensors read and write over ``protocol/``'s tensor frames (child processes only:
                          it imports torch)
"""
