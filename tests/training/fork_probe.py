"""A rank for the fork server's tests: reports what it sees as JSON to $PROBE_OUT, then exits as $PROBE_EXIT says."""

import json
import os
import sys

import numpy as np

import tests.training.fork_preloaded as preloaded

with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
    cmdline = [a.decode() for a in fh.read().split(b"\0")[:-1]]
with open(f"/proc/{os.getpid()}/environ", "rb") as fh:
    environ = dict(kv.decode().split("=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
jit = sys.modules.get("graphstore_fork_server_jit")
counted = sys.modules["graphstore.jitcache"].compile_counts().compiled if "graphstore.jitcache" in sys.modules else None
with open(os.environ["PROBE_OUT"], "w") as fh:
    json.dump({"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "argv": sys.argv[1:],
               "rank": os.environ["PROBE_RANK"], "proc_cmdline": cmdline[1:], "proc_rank": environ.get("PROBE_RANK"),
               "server_env": any(k.startswith("GRAPHSTORE_FORK_SERVER") for k in os.environ),
               "imported_by": preloaded.IMPORTED_BY, "draw": int(np.random.randint(0, 2**62)),
               "jit_started": bool(jit and jit.started.signatures), "compiles_counted": counted}, fh)
how = os.environ.get("PROBE_EXIT", "0")
if how == "raise":
    raise RuntimeError("the probe's own error")
sys.exit(int(how))
