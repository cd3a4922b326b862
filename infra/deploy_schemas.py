"""Builds the JSON schemas the deployment tests validate against, into var/schemas/.

Run by infra/deploy-tools.sh (`make setup`), from sources fetched through package registries:

* Kubernetes: the `-local-strict` schemas shipped in the PyPI wheel `kubernetes-validate`. Their
  `$ref`s point at a shared `/api/_definitions.json` under a `kubernetes.io` `$id`, which
  kubeconform would try to fetch; each kind's schema is made standalone instead (the `$id` dropped,
  the definitions it reaches copied into its own `$defs`, the references made local). Written as
  `kubernetes/v{VERSION}-standalone-strict/`, the layout kubeconform's `-schema-location` template
  expects.
* Custom resources: the CRDs of the Go module `github.com/kedacore/keda/v2`
  (`config/crd/bases`), each version's `openAPIV3Schema` made strict the way kubeconform's
  `openapi2jsonschema.py` does it (`additionalProperties: false` wherever `properties` are listed,
  the root included), written as `crds/{group}/{kind}_{version}.json`.
* Compose: `schema/compose-spec.json` of the Go module `github.com/compose-spec/compose-go/v2`,
  copied as `compose-spec.json`.

`manifest.json` records what was built and from which versions; the tests read it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

_WHEEL_ROOT = "kubernetes_validate/kubernetes-json-schema"
_ABSOLUTE_REF = '"/api/_definitions.json#/$defs/'
_LOCAL_DEFS = "#/$defs/"


def strict(node: Any) -> Any:
    """`additionalProperties: false` on every object schema that lists its properties."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_LOCAL_DEFS):
            found.add(ref[len(_LOCAL_DEFS) :])
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def standalone(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """`schema` with the definitions it reaches, and nothing else, in its own `$defs`."""
    wanted: set[str] = set()
    _refs(schema, wanted)
    pending, seen = list(wanted), set(wanted)
    while pending:
        reached: set[str] = set()
        _refs(definitions[pending.pop()], reached)
        pending.extend(reached - seen)
        seen |= reached
    schema = {k: v for k, v in schema.items() if k != "$id"}
    schema["$defs"] = {name: definitions[name] for name in sorted(seen)}
    return schema


def _local(archive: zipfile.ZipFile, name: str) -> dict[str, Any]:
    """One schema of the wheel, its references to the shared definitions made local."""
    text = archive.read(name).decode().replace(_ABSOLUTE_REF, '"' + _LOCAL_DEFS)
    schema: dict[str, Any] = json.loads(text)
    return schema


def kubernetes(wheel: Path, versions: list[str], out: Path) -> dict[str, int]:
    """Each version's strict schemas, each made standalone: the definitions it uses inlined, so
    kubeconform compiles a Deployment's schema without the 1 MB of every other kind's."""
    counts = {}
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for version in versions:
            prefix = f"{_WHEEL_ROOT}/v{version}-local-strict/"
            members = [n for n in names if n.startswith(prefix) and n.endswith(".json")]
            if not members:
                raise SystemExit(f"{wheel.name} has no schemas for Kubernetes {version}")
            definitions = _local(archive, prefix + "_definitions.json")["$defs"]
            target = out / "kubernetes" / f"v{version}-standalone-strict"
            target.mkdir(parents=True, exist_ok=True)
            written = 0
            for name in members:
                schema = _local(archive, name)
                # Only kinds (kubeconform looks nothing else up), not their parts (DeploymentSpec).
                if "x-kubernetes-group-version-kind" not in schema:
                    continue
                (target / name[len(prefix) :]).write_text(
                    json.dumps(standalone(schema, definitions))
                )
                written += 1
            counts[version] = written
    return counts


def crds(directory: Path, out: Path) -> list[str]:
    """One strict schema per kind and served version of every CRD in `directory`."""
    written = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            group, kind = spec["group"], spec["names"]["kind"].lower()
            for version in spec["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    continue
                target = out / "crds" / group / f"{kind}_{version['name']}.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(strict(schema)))
                written.append(f"{group}/{kind}_{version['name']}")
    if not written:
        raise SystemExit(f"no CustomResourceDefinition found in {directory}")
    return written


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kubernetes-wheel", type=Path, required=True)
    parser.add_argument("--kubernetes-versions", required=True, help="comma-separated")
    parser.add_argument("--crd-dir", type=Path, required=True)
    parser.add_argument("--compose-schema", type=Path, required=True)
    parser.add_argument("--sources", required=True, help="JSON object: what came from where")
    args = parser.parse_args(argv)

    staging = args.out.with_name(args.out.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    versions = [v.strip() for v in args.kubernetes_versions.split(",") if v.strip()]
    manifest = {
        "sources": json.loads(args.sources),
        "kubernetes_versions": versions,
        "kubernetes_schemas": kubernetes(args.kubernetes_wheel, versions, staging),
        "crds": crds(args.crd_dir, staging),
        "compose_schema": "compose-spec.json",
    }
    shutil.copyfile(args.compose_schema, staging / "compose-spec.json")
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    # Replaced whole, so an interrupted build never leaves a half-written folder in use.
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"deploy-schemas: wrote {args.out} ({', '.join(versions)}; {len(manifest['crds'])} CRDs)")


if __name__ == "__main__":
    main(sys.argv[1:])
