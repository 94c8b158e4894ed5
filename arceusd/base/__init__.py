"""The plumbing every part of the daemon may use; it imports nothing else of the project (the lowest layer).

- ``identity.py``      the Ed25519 device key, peer ids, signatures (``protocol/`` builds on it)
- ``paths.py``         the state directory and the files in it
- ``control.py``       the control socket (unix, mode 0600): its framing, errors and the callers' blocking ``call``
                       (no trio: a command of the CLI starts without it)
- ``control_server.py`` the daemon's side of that socket (trio)
- ``logs.py``          logging set-up for the daemon and the workers
- ``failures.py``      how failures reach the user: one line and a non-zero exit, a traceback only at debug
- ``failpoints.py``    named fault-injection points the tests switch on (``ARCEUS_FAILPOINTS``)
- ``atomic_files.py``  writing a file whole or not at all (checkpoints, records, the quote's timings)
- ``fdlimit.py``       the open-files limit raised at start; accept loops wait out EMFILE
- ``text_safety.py``   escaping strings strangers sent before a view shows them
"""
