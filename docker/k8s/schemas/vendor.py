"""Write the OpenAPI schema of a CRD, trimmed, as the YAML file tests/test_k8s.py validates against.

    python docker/k8s/schemas/vendor.py CRD.yaml OUT.yaml --source kserve/kserve --release v0.20.0 \
        --commit SHA --crd-path config/crd/full/serving.kserve.io_inferenceservices.yaml [--drop a.b.c ...]

Takes the ``openAPIV3Schema`` of the CRD's storage version, removes every ``description`` (the
schema is for a validator, not for reading), the ``status`` (written by controllers, never by a
manifest) and each ``--drop`` path (dotted property names below the root: parts of the resource
the manifests here do not use; a manifest that uses one is then refused by the test, which is the
signal to vendor it). The header names the source, release, commit, file and licence.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import yaml


def _without_descriptions(node):
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def _drop(schema: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = schema
    for name in parents:
        node = node["properties"][name]
    if leaf not in node.get("properties", {}):
        raise SystemExit(
            f"--drop {dotted}: no property {leaf!r} there; properties: {sorted(node.get('properties', {}))}"
        )
    del node["properties"][leaf]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crd", type=Path, help="the CustomResourceDefinition YAML")
    parser.add_argument("out", type=Path, help="the schema file to write")
    parser.add_argument("--source", required=True, help="owner/name of the repository the CRD comes from")
    parser.add_argument("--release", required=True, help="its release tag")
    parser.add_argument("--commit", required=True, help="the tag's commit")
    parser.add_argument("--crd-path", required=True, help="the CRD file's path in that repository")
    parser.add_argument("--drop", action="append", default=[], metavar="DOTTED.PATH", help="a property to leave out")
    args = parser.parse_args(argv)
    crd = yaml.safe_load(args.crd.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = _without_descriptions(version["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status", None)
    for dotted in args.drop:
        _drop(schema, dotted)
    names = crd["spec"]["names"]
    left_out = f"; left out: {', '.join(args.drop)}" if args.drop else ""
    text = (
        f"OpenAPI schema of {names['kind']} ({crd['spec']['group']}/{version['name']}): the "
        f"CustomResourceDefinition's openAPIV3Schema from {args.source} release {args.release} (commit "
        f"{args.commit}), file {args.crd_path}. Licensed under the Apache License 2.0 (the LICENSE of "
        f"{args.source}). Trimmed by docker/k8s/schemas/vendor.py: descriptions and status removed{left_out}. "
        "Do not edit: regenerate it with vendor.py from the release's CRD."
    )
    header = ["# " + line for line in textwrap.wrap(text, 98, break_on_hyphens=False)]
    body = yaml.safe_dump(schema, sort_keys=True, width=120)
    args.out.write_text("\n".join(header) + "\n" + body)
    print(f"wrote {args.out}: {len(body):,} bytes of schema", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
