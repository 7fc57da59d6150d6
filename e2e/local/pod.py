"""What the kubelet does for a pod's container, done on this machine: volumes as folders, env resolved.

Pure with respect to the API: `read` is a callable `(kind, name) -> object | None` that fetches a
ConfigMap or Secret from the namespace, so the functions here can be tested with plain dicts.

Kubernetes rules kept (core/v1 Container docs): `envFrom` sources first, then `env` (later entries
win); `$(VAR)` in a value expands to a variable defined earlier, `$$` escapes it; a missing Secret or
ConfigMap (or key) that is not `optional` stops the container from starting (the kubelet's
CreateContainerConfigError), which here is a `PodNotReady` with the kubelet-like reason.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

Obj = dict[str, Any]
Reader = Callable[[str, str], Obj | None]
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


class PodNotReady(RuntimeError):
    """The container cannot start yet; `reason` is what `kubectl describe pod` would show."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class PodFields:
    """The pod facts a downward-API `fieldRef` can read."""

    name: str
    namespace: str
    pod_ip: str = "127.0.0.1"
    node_name: str = "localhost"

    def get(self, path: str) -> str:
        """The value of `fieldRef.fieldPath`; raises PodNotReady for a path this stand-in does not know."""
        values = {"metadata.name": self.name, "metadata.namespace": self.namespace,
                  "status.podIP": self.pod_ip, "spec.nodeName": self.node_name}
        if path not in values:
            raise PodNotReady("CreateContainerConfigError",
                              f"fieldRef {path!r} is not emulated; use one of {sorted(values)}")
        return values[path]


def object_data(kind: str, obj: Obj) -> dict[str, str]:
    """Keys of a ConfigMap or Secret as text (Secret `data` is base64; `stringData` taken as written)."""
    if kind == "Secret":
        decoded = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {**decoded, **(obj.get("stringData") or {})}
    return dict(obj.get("data") or {})


def _source(read: Reader, kind: str, ref: Obj, key: str | None = None) -> str | dict[str, str] | None:
    """A whole ConfigMap/Secret (key None) or one key; None when missing and `optional`."""
    obj = read(kind, ref["name"])
    if obj is None:
        if ref.get("optional"):
            return None
        raise PodNotReady("CreateContainerConfigError", f"{kind.lower()} {ref['name']!r} not found")
    data = object_data(kind, obj)
    if key is None:
        return data
    if key not in data:
        if ref.get("optional"):
            return None
        raise PodNotReady("CreateContainerConfigError",
                          f"couldn't find key {key} in {kind} {ref['name']!r}")
    return data[key]


def expand(value: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, unknown ones kept, `$$` gives `$`."""
    def repl(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REF.sub(repl, value)


def resolve_env(container: Obj, pod: PodFields, read: Reader) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom, then env in order)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if field in source:
                data = _source(read, kind, source[field]) or {}
                assert isinstance(data, dict)
                env.update({prefix + k: v for k, v in data.items() if _ENV_NAME.match(prefix + k)})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        src = var["valueFrom"]
        value: Any
        if "fieldRef" in src:
            value = pod.get(src["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in src:
            value = _source(read, "Secret", src["secretKeyRef"], src["secretKeyRef"]["key"])
        elif "configMapKeyRef" in src:
            value = _source(read, "ConfigMap", src["configMapKeyRef"], src["configMapKeyRef"]["key"])
        else:
            raise PodNotReady("CreateContainerConfigError",
                              f"env {name}: valueFrom {sorted(src)} is not emulated (fieldRef, secretKeyRef and "
                              "configMapKeyRef are)")
        if value is not None:
            env[name] = str(value)
    return env


class PodRoot:
    """A folder standing for the container's filesystem: `/etc/x` in the pod is `<root>/etc/x` here."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def local(self, pod_path: str) -> Path:
        """The local path of an absolute path inside the container."""
        parts = PurePosixPath(pod_path).parts
        if not parts or parts[0] != "/" or ".." in parts:
            raise ValueError(f"{pod_path!r} is not an absolute path inside the container")
        return self.root.joinpath(*parts[1:])

    def mount_volumes(self, pod_spec: Obj, container: Obj, read: Reader) -> None:
        """Materialise the container's ConfigMap/Secret/emptyDir mounts (what the kubelet mounts)."""
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise PodNotReady("FailedMount", f"volumeMount {mount['name']!r} names no volume of the pod")
            target = self.local(mount["mountPath"])
            target.mkdir(parents=True, exist_ok=True)
            for field, kind, ref_key in (("configMap", "ConfigMap", "name"), ("secret", "Secret", "secretName")):
                if field not in volume:
                    continue
                ref = {"name": volume[field][ref_key], "optional": volume[field].get("optional", False)}
                data = _source(read, kind, ref) or {}
                assert isinstance(data, dict)
                items = volume[field].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise PodNotReady("FailedMount", f"{kind} {ref['name']!r} has no key {item['key']!r}")
                    path = target / item["path"]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(data[item["key"]])
