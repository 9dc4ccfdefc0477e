#!/usr/bin/env python3
"""Checks deploy/image/build-image.sh against a build tree, without an image
builder: (1) its --list names the binary, every installed plugin with its
manifest, the program interpreter, the model, and every library ldd says the
binary and the plugins load (less the NVIDIA driver's, which the node
provides); (2) the --rootfs it writes is self-contained: its own loader,
kept from the host's cache and default directories by --inhibit-cache and
--library-path, resolves every library of the binary and of the plugins to a
file inside it, and the server started that way from the rootfs answers
/health and a completion with the baked-in model.

usage: check_image.py --script build-image.sh --build-dir BUILD --model MODEL
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

DRIVER_LIB = re.compile(r"^(libcuda\.so|libnvidia-|libcudadebugger\.so)")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def ldd(path):
    """{soname: resolved path} of the libraries ldd resolves for path."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            libs[m.group(1)] = m.group(2)
        elif "=> not found" in line:
            libs[line.split()[0]] = None
    return libs


def interpreter(path):
    out = subprocess.run(["readelf", "-l", path], capture_output=True, text=True, check=True,
                         env=dict(os.environ, LC_ALL="C")).stdout
    m = re.search(r"Requesting program interpreter: (\S+)\]", out)
    return m.group(1) if m else None


def check_list(args):
    out = subprocess.run([args.script, "--list", "--build-dir", args.build_dir, "--model", args.model],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"--list exited {out.returncode}: {out.stderr.strip()}")
        return
    dests = [line.split("\t")[0] for line in out.stdout.splitlines() if line]
    names = {os.path.basename(d) for d in dests}
    binary = os.path.join(args.build_dir, "bin", "engine-host")
    plugin_dir = os.path.join(args.build_dir, "plugins")
    plugins = sorted(f for f in os.listdir(plugin_dir) if f.startswith("libeh-") and f.endswith(".so"))
    if not plugins:
        fail(f"no plugins in {plugin_dir} to check against")
    want = {"/opt/engine-host/bin/engine-host", interpreter(binary),
            "/opt/engine-host/models/" + os.path.basename(args.model)}
    for p in plugins:
        name = p[len("libeh-"):-len(".so")]
        want.add("/opt/engine-host/lib/engine-host/plugins/" + p)
        want.add(f"/opt/engine-host/lib/engine-host/plugins/{name}.manifest.json")
    for w in sorted(want):
        if w not in dests:
            fail(f"--list lacks {w}")
    for elf in [binary] + [os.path.join(plugin_dir, p) for p in plugins]:
        for soname in ldd(elf):
            if DRIVER_LIB.match(soname):
                if soname in names:
                    fail(f"--list ships {soname}, a driver library the node provides")
            elif soname not in names:
                fail(f"--list lacks {soname}, which {os.path.basename(elf)} loads")
    if len(dests) != len(set(dests)):
        fail("--list names a destination twice")
    print(f"--list: {len(dests)} files; binary, {len(plugins)} plugin(s), their libraries present")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, body=None, timeout=10):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_rootfs(args):
    tmp = tempfile.mkdtemp(prefix="eh-rootfs-")
    root = os.path.join(tmp, "rootfs")
    try:
        # One CPU plugin keeps the copy small on a CUDA build (no cuBLAS).
        out = subprocess.run([args.script, "--rootfs", root, "--build-dir", args.build_dir,
                              "--model", args.model, "--plugin", "cpu-reference"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"--rootfs exited {out.returncode}: {out.stderr.strip()}")
            return
        binary = root + "/opt/engine-host/bin/engine-host"
        interp = interpreter(binary)
        loader = root + interp
        libdirs = sorted({os.path.dirname(p) for p in _files(root) if ".so" in os.path.basename(p)})
        run = [loader, "--inhibit-cache", "--library-path", ":".join(libdirs)]
        plugin_dir = root + "/opt/engine-host/lib/engine-host/plugins"
        for elf in [binary] + [os.path.join(plugin_dir, f) for f in os.listdir(plugin_dir) if f.endswith(".so")]:
            listing = subprocess.run(run + ["--list", elf], capture_output=True, text=True)
            if listing.returncode != 0:
                fail(f"the rootfs loader cannot list {elf}: {listing.stderr.strip()}")
                continue
            for line in listing.stdout.splitlines():
                m = re.match(r"\s*(\S+) => (\S+)", line)
                if m and not m.group(2).startswith(root + "/"):
                    fail(f"{os.path.basename(elf)} loads {m.group(1)} from {m.group(2)}, outside the rootfs")
                if "not found" in line:
                    fail(f"{os.path.basename(elf)}: {line.strip()}")
        port = free_port()
        model = root + "/opt/engine-host/models/" + os.path.basename(args.model)
        server = subprocess.Popen(run + [binary, "serve", "--model", model, "--plugins", plugin_dir,
                                         "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 60
            status = None
            while time.time() < deadline and server.poll() is None:
                try:
                    status, _ = get(base + "/health", timeout=2)
                    if status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            if status != 200:
                fail(f"the server from the rootfs never answered /health 200 (last {status}, exit {server.poll()})")
                return
            status, body = get(base + "/v1/completions",
                               json.dumps({"prompt": "Once upon a time", "max_tokens": 8,
                                           "temperature": 0}).encode(), timeout=60)
            text = json.loads(body)["choices"][0]["text"] if status == 200 else ""
            if status != 200 or not text:
                fail(f"completion from the rootfs server: HTTP {status} {body[:200]!r}")
            else:
                print(f"rootfs server: /health 200, completion {text!r}")
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                fail("the rootfs server did not exit within 20 s of SIGTERM")
            if server.returncode not in (0, None) and not failures:
                fail(f"the rootfs server exited {server.returncode} on SIGTERM")
            if failures:
                print(server.stdout.read()[-3000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _files(root):
    for d, _, fs in os.walk(root):
        for f in fs:
            yield os.path.join(d, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    check_list(args)
    check_rootfs(args)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
