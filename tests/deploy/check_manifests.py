#!/usr/bin/env python3
"""Checks the Kubernetes manifests under deploy/k8s against the engine-host
they run:

- every file parses as YAML, every document has apiVersion and kind;
- every engine-host container (image named engine-host) runs a subcommand
  that exists with options that exist: each --flag is looked up in
  `engine-host <subcommand> --help`;
- serve containers bind 0.0.0.0, expose --port as a containerPort, probe
  that port (by number or name) with HTTPS exactly when --ssl-cert-file is
  given, expose the port of --kv-events-endpoint, ask for a GPU, and get a
  termination grace that covers the preStop pause and --shutdown-grace-ms;
- Services, InferencePools and HTTPRoutes point at things in the same file
  that exist: a Service's targetPort is a port of the pods it selects, an
  InferencePool selects engine-host pods and targets their --port, its
  endpoint picker is a Service of the file with that port, an HTTPRoute's
  InferencePool backend is in the file;
- an endpoint picker config (ConfigMap) parses, its profiles name declared
  plugins, and a precise prefix-cache scorer's block size, hash seed and
  KV-event port equal --kv-events-block-tokens, --kv-events-hash-seed and
  the --kv-events-endpoint port of the pods that publish;
- a Kustomization's resources exist;
- a KServe LLMInferenceService serves spec.model.name on port 8000 from
  /mnt/models;
- every HTTP probe path answers 200 on a ready server (the built-in model).

usage: check_manifests.py --engine-host BIN --plugins DIR --model MODEL DIR...
"""
import argparse
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import yaml

IMAGE = re.compile(r"(^|/)engine-host(:|@|$)")
# The image's entrypoint (deploy/image/build-image.sh).
ENTRYPOINT = ["/opt/engine-host/bin/engine-host", "serve", "--host", "0.0.0.0"]
failures = []


def fail(where, msg):
    failures.append(f"{where}: {msg}")
    print(f"FAIL: {where}: {msg}")


class Options:
    """The options of `engine-host <sub> --help`: name -> takes a value."""
    cache = {}

    @classmethod
    def of(cls, binary, sub):
        if sub not in cls.cache:
            out = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
            opts = {}
            if out.returncode == 0:
                for line in out.stdout.splitlines():
                    # "  --port arg (=8080)   ...", "  -m [ --model ] arg   ..."
                    m = re.match(r"^  (?:-\w \[ )?--([a-z0-9][a-z0-9-]*)(?: \])?( arg)?", line)
                    if m:
                        opts[m.group(1)] = bool(m.group(2))
            cls.cache[sub] = opts if opts else None
        return cls.cache[sub]


def parse_argv(where, binary, command, args):
    """(subcommand, {flag: [values]}) of a container, or None if not ours."""
    if command:
        if os.path.basename(command[0]) != "engine-host":
            fail(where, f"command {command[0]!r} is not engine-host")
            return None
        rest = list(command[1:]) + list(args or [])
    else:
        rest = ENTRYPOINT[1:] + list(args or [])
    sub = rest[0] if rest and not rest[0].startswith("-") else "serve"
    if rest and rest[0] == sub:
        rest = rest[1:]
    opts = Options.of(binary, sub)
    if opts is None:
        fail(where, f"engine-host has no subcommand {sub!r} (its --help fails)")
        return None
    flags = {}
    i = 0
    while i < len(rest):
        tok = str(rest[i])
        i += 1
        if not tok.startswith("--"):
            continue  # a positional (pull REF) or a value
        name, eq, val = tok[2:].partition("=")
        if name not in opts:
            fail(where, f"engine-host {sub} has no option --{name}")
            continue
        if opts[name] and not eq:
            if i >= len(rest):
                fail(where, f"--{name} needs a value")
                continue
            val = str(rest[i])
            i += 1
        elif not opts[name] and eq:
            fail(where, f"--{name} takes no value")
        flags.setdefault(name, []).append(val if opts[name] else "")
    return sub, flags


def one(flags, name, default=None):
    v = flags.get(name)
    return v[-1] if v else default


def port_of(container, ref):
    """A probe's or Service's port (number or name) as a number, or None."""
    for p in container.get("ports", []) or []:
        if ref == p.get("containerPort") or ref == p.get("name"):
            return p.get("containerPort")
    return ref if isinstance(ref, int) else None


def pod_specs(doc):
    """(labels, pod spec, kind) of the pods a document creates."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        tmpl = spec.get("template") or {}
        yield (tmpl.get("metadata") or {}).get("labels") or {}, tmpl.get("spec") or {}, kind
    elif kind == "Pod":
        yield (doc.get("metadata") or {}).get("labels") or {}, spec, kind
    elif kind == "LLMInferenceService":
        if spec.get("template"):
            yield {}, spec["template"], kind


class Serve:
    def __init__(self, where, labels, pod, container, flags):
        self.where, self.labels, self.pod, self.container, self.flags = where, labels, pod, container, flags
        self.port = int(one(flags, "port", 8080))


def check_serve(s, probe_paths):
    where, c, f = s.where, s.container, s.flags
    host = one(f, "host", "127.0.0.1")
    if host not in ("0.0.0.0", "::"):
        fail(where, f"--host {host}: the pod's other interfaces cannot reach it (use 0.0.0.0)")
    if s.port not in [p.get("containerPort") for p in c.get("ports", []) or []]:
        fail(where, f"--port {s.port} is not a containerPort")
    tls = "ssl-cert-file" in f
    probes = 0
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = c.get(kind)
        if not probe:
            continue
        http = probe.get("httpGet")
        if not http:
            continue
        probes += 1
        if port_of(c, http.get("port")) != s.port:
            fail(where, f"{kind} port {http.get('port')} is not --port {s.port}")
        scheme = http.get("scheme", "HTTP")
        if scheme != ("HTTPS" if tls else "HTTP"):
            fail(where, f"{kind} scheme {scheme} but the server speaks {'HTTPS' if tls else 'HTTP'}")
        probe_paths.add(http.get("path", "/"))
    if not c.get("livenessProbe") or not c.get("readinessProbe"):
        fail(where, "needs both a livenessProbe and a readinessProbe")
    ep = one(f, "kv-events-endpoint")
    if ep is not None:
        m = re.match(r"^tcp://(\*|0\.0\.0\.0|\[::\]):(\d+)$", ep)
        if not m:
            fail(where, f"--kv-events-endpoint {ep}: a pod binds tcp://*:PORT for the scheduler to dial")
        elif int(m.group(2)) not in [p.get("containerPort") for p in c.get("ports", []) or []]:
            fail(where, f"the KV-event port {m.group(2)} is not a containerPort")
    res = c.get("resources") or {}
    if "nvidia.com/gpu" not in (res.get("limits") or {}):
        fail(where, "asks for no GPU (resources.limits nvidia.com/gpu)")
    grace_ms = int(one(f, "shutdown-grace-ms", 4500)) + 500
    pre = (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0)
    pod_grace = s.pod.get("terminationGracePeriodSeconds", 30)
    if pod_grace * 1000 < grace_ms + pre * 1000:
        fail(where, f"terminationGracePeriodSeconds {pod_grace} < preStop {pre} s + "
                    f"--shutdown-grace-ms and the 500 ms for streams ({grace_ms} ms)")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_file(path, name, binary, probe_paths):
    try:
        with open(path) as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    except yaml.YAMLError as e:
        fail(name, f"YAML: {e}")
        return
    serves, pods, services, pools = [], [], {}, {}
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            fail(f"{name}#{i}", "not a Kubernetes object (apiVersion, kind)")
            continue
        where = f"{name} {doc['kind']}/{(doc.get('metadata') or {}).get('name')}"
        if doc["kind"] == "Kustomization":
            for r in doc.get("resources") or []:
                if not os.path.exists(os.path.join(os.path.dirname(path), r)):
                    fail(where, f"resource {r} does not exist")
        if doc["kind"] == "Service":
            services[doc["metadata"]["name"]] = doc
        if doc["kind"] == "InferencePool":
            pools[doc["metadata"]["name"]] = doc
        for labels, pod, kind in pod_specs(doc):
            pods.append((labels, pod))
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                if not IMAGE.search(str(c.get("image", ""))):
                    continue
                cw = f"{where} container {c.get('name')}"
                parsed = parse_argv(cw, binary, c.get("command"), c.get("args"))
                if parsed and parsed[0] == "serve":
                    s = Serve(cw, labels, pod, c, parsed[1])
                    serves.append(s)
                    check_serve(s, probe_paths)
                    if kind == "LLMInferenceService":
                        check_kserve(cw, doc, s)
        if doc["kind"] == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                if "EndpointPickerConfig" in str(text):
                    check_epp_config(f"{where} {key}", text, serves)
    for sname, svc in services.items():
        sel = (svc.get("spec") or {}).get("selector") or {}
        chosen = [pod for labels, pod in pods if selects(sel, labels)]
        if not chosen:
            fail(f"{name} Service/{sname}", f"selects no pod of the file ({sel})")
        for p in (svc.get("spec") or {}).get("ports") or []:
            tp = p.get("targetPort", p.get("port"))
            if chosen and not any(port_of(c, tp) is not None and
                                  (isinstance(tp, int) or any(q.get("name") == tp for q in c.get("ports") or []))
                                  for pod in chosen for c in pod.get("containers") or []):
                fail(f"{name} Service/{sname}", f"targetPort {tp} is no port of the pods it selects")
    for pname, pool in pools.items():
        where = f"{name} InferencePool/{pname}"
        spec = pool.get("spec") or {}
        if pool["apiVersion"] != "inference.networking.k8s.io/v1":
            fail(where, f"apiVersion {pool['apiVersion']} (the GA API is inference.networking.k8s.io/v1)")
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        members = [s for s in serves if selects(sel, s.labels)]
        if not members:
            fail(where, f"selects no engine-host pod of the file ({sel})")
        ports = [p.get("number") for p in spec.get("targetPorts") or []]
        for s in members:
            if ports != [s.port]:
                fail(where, f"targetPorts {ports} but its pods serve on --port {s.port}")
        ref = spec.get("endpointPickerRef") or {}
        svc = services.get(ref.get("name"))
        if not svc:
            fail(where, f"endpointPickerRef {ref.get('name')} is no Service of the file")
        elif (ref.get("port") or {}).get("number") not in [p.get("port") for p in svc["spec"].get("ports") or []]:
            fail(where, f"endpointPickerRef port {(ref.get('port') or {}).get('number')} is not a port of "
                        f"Service/{ref.get('name')}")
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "HTTPRoute":
            for rule in (doc.get("spec") or {}).get("rules") or []:
                for b in rule.get("backendRefs") or []:
                    if b.get("kind") == "InferencePool":
                        where = f"{name} HTTPRoute/{doc['metadata']['name']}"
                        if b.get("group") != "inference.networking.k8s.io":
                            fail(where, f"InferencePool backend group {b.get('group')}")
                        if b.get("name") not in pools:
                            fail(where, f"backend InferencePool/{b.get('name')} is not in the file")


def check_epp_config(where, text, serves):
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(where, f"YAML: {e}")
        return
    if not isinstance(cfg, dict) or cfg.get("kind") != "EndpointPickerConfig":
        fail(where, "not an EndpointPickerConfig")
        return
    declared = {p.get("name") or p.get("type") for p in cfg.get("plugins") or []}
    for prof in cfg.get("schedulingProfiles") or []:
        for ref in prof.get("plugins") or []:
            if ref.get("pluginRef") not in declared:
                fail(where, f"profile {prof.get('name')} names undeclared plugin {ref.get('pluginRef')}")
    for p in cfg.get("plugins") or []:
        if p.get("type") != "precise-prefix-cache-scorer":
            continue
        params = p.get("parameters") or {}
        block = (params.get("tokenProcessorConfig") or {}).get("blockSize")
        socket_port = ((params.get("kvEventsConfig") or {}).get("podDiscoveryConfig") or {}).get("socketPort")
        publishers = [s for s in serves if "kv-events-endpoint" in s.flags]
        if not publishers:
            fail(where, "a precise prefix-cache scorer but no engine-host pod publishes KV events")
        for s in publishers:
            tokens = one(s.flags, "kv-events-block-tokens")
            if tokens is None or int(tokens) != block:
                fail(where, f"blockSize {block} but {s.where} has --kv-events-block-tokens {tokens}")
            seed = str((params.get("tokenProcessorConfig") or {}).get("hashSeed", ""))
            if one(s.flags, "kv-events-hash-seed", "") != seed:
                fail(where, f"hashSeed {seed!r} but {s.where} has --kv-events-hash-seed "
                            f"{one(s.flags, 'kv-events-hash-seed', '')!r}")
            ep_port = int(one(s.flags, "kv-events-endpoint").rsplit(":", 1)[1])
            if socket_port != ep_port:
                fail(where, f"podDiscoveryConfig.socketPort {socket_port} but {s.where} publishes on {ep_port}")


def check_kserve(where, doc, s):
    spec = doc.get("spec") or {}
    model = spec.get("model") or {}
    names = s.flags.get("served-model-name", []) + s.flags.get("model-name", [])
    if model.get("name") and model["name"] not in names:
        fail(where, f"does not serve spec.model.name {model['name']!r} (served: {names})")
    if s.port != 8000:
        fail(where, f"--port {s.port}: KServe's workload Service and InferencePool target 8000")
    if re.match(r"^(hf|s3|gs|pvc)://", str(model.get("uri", ""))) and one(s.flags, "model") != "/mnt/models":
        fail(where, f"--model {one(s.flags, 'model')}: the storage initializer puts {model.get('uri')} "
                    "in /mnt/models")


def free_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def check_probe_paths(binary, plugins, model, paths):
    """Every probe path answers 200 once the server is ready."""
    port = free_port()
    server = subprocess.Popen([binary, "serve", "--model", model, "--plugins", plugins, "--device", "cpu",
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def status(path):
        try:
            with urllib.request.urlopen(base + path, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    try:
        deadline = time.time() + 60
        while time.time() < deadline and server.poll() is None and status("/health") != 200:
            time.sleep(0.2)
        if status("/health") != 200:
            fail("probe paths", f"the server with {model} never became healthy")
            return
        for p in sorted(paths):
            got = status(p)
            if got != 200:
                fail("probe paths", f"GET {p} answers {got} on a ready server")
            else:
                print(f"probe path {p}: 200")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-host", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    # (path, name shown: relative to the directory given, under its name)
    files = sorted((f, os.path.join(os.path.basename(os.path.normpath(d)), os.path.relpath(f, d)))
                   for d in args.dirs for ext in ("yaml", "yml")
                   for f in glob.glob(os.path.join(d, "**", "*." + ext), recursive=True))
    if not files:
        fail("manifests", f"no YAML under {args.dirs}")
    probe_paths = set()
    for f, name in files:
        check_file(f, name, args.engine_host, probe_paths)
        print(f"checked {name}")
    if probe_paths:
        check_probe_paths(args.engine_host, args.plugins, args.model, probe_paths)
    else:
        fail("manifests", "no engine-host container with an HTTP probe")
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
