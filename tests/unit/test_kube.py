"""The operator's API client: credentials from a kubeconfig or a pod, REST paths, verbs against the emulator."""

from __future__ import annotations

import base64
import pathlib
from typing import Any

import pytest
import yaml

from rljob_operator import kube
from rljob_operator.kube import Credentials, KubeApiError, KubeClient, load_credentials, resource_path
from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_rbac import service_account


def kubeconfig(path: pathlib.Path, cluster: dict[str, Any], user: dict[str, Any], current: str = "ctx") -> str:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": current,
              "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "https://x"}}],
              "users": [{"name": "u", "user": user}],
              "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}},
                           {"name": "wrong", "context": {"cluster": "other", "user": "u"}}]}
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_token_and_insecure(tmp_path: pathlib.Path) -> None:
    creds = load_credentials(kubeconfig(tmp_path / "kc", {"server": "https://k8s:6443/", "insecure-skip-tls-verify":
                                                         True}, {"token": "t0k"}))
    assert (creds.server, creds.token, creds.insecure, creds.ca_file) == ("https://k8s:6443", "t0k", True, None)


def test_embedded_certificates_become_private_files(tmp_path: pathlib.Path) -> None:
    ca, cert, key = b"CA PEM", b"CERT PEM", b"KEY PEM"
    path = kubeconfig(tmp_path / "kc", {"server": "https://k8s", "certificate-authority-data": base64.b64encode(ca)
                                        .decode()},
                      {"client-certificate-data": base64.b64encode(cert).decode(),
                       "client-key-data": base64.b64encode(key).decode()})
    creds = load_credentials(path)
    assert creds.ca_file and creds.cert_file and creds.key_file
    for name, data in ((creds.ca_file, ca), (creds.cert_file, cert), (creds.key_file, key)):
        assert pathlib.Path(name).read_bytes() == data
        assert pathlib.Path(name).stat().st_mode & 0o777 == 0o600
        pathlib.Path(name).unlink()


def test_file_references_and_token_file(tmp_path: pathlib.Path) -> None:
    path = kubeconfig(tmp_path / "kc", {"server": "https://k8s", "certificate-authority": "/ca.crt"},
                      {"client-certificate": "/c.crt", "client-key": "/c.key", "tokenFile": "/tok"})
    creds = load_credentials(path)
    assert (creds.ca_file, creds.cert_file, creds.key_file, creds.token_file) == (
        "/ca.crt", "/c.crt", "/c.key", pathlib.Path("/tok"))


def test_kubeconfig_env_first_entry(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kubeconfig(tmp_path / "kc", {"server": "http://127.0.0.1:1"}, {"token": "a"})
    monkeypatch.setenv("KUBECONFIG", f"{path}:{tmp_path / 'missing'}")
    assert load_credentials().server == "http://127.0.0.1:1"


def test_errors_say_what_to_do(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="does not exist and this is not a pod; set KUBECONFIG"):
        load_credentials(str(tmp_path / "nope"))
    path = kubeconfig(tmp_path / "kc", {"server": "https://k8s"}, {}, current="gone")
    with pytest.raises(RuntimeError, match="current-context 'gone' is not defined; run `kubectl config use-context"):
        load_credentials(path)


def test_in_cluster_service_account(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    monkeypatch.setattr(kube, "SA_DIR", tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = load_credentials()
    assert creds.server == "https://[fd00::1]:443"
    assert (creds.token_file, creds.ca_file) == (tmp_path / "token", str(tmp_path / "ca.crt"))
    assert KubeClient(creds)._auth() == {"Authorization": "Bearer sa-token"}


@pytest.mark.parametrize(("args", "path"), [
    (("v1", "configmaps", "ns", "x"), "/api/v1/namespaces/ns/configmaps/x"),
    (("v1", "namespaces", None, "ns"), "/api/v1/namespaces/ns"),
    (("ray.io/v1", "rayjobs", "ns", None), "/apis/ray.io/v1/namespaces/ns/rayjobs"),
    (("rl.hybridflow.dev/v1alpha1", "rljobs", "ns", "j", "status"),
     "/apis/rl.hybridflow.dev/v1alpha1/namespaces/ns/rljobs/j/status"),
])
def test_resource_path(args: tuple[Any, ...], path: str) -> None:
    assert resource_path(*args) == path


@pytest.mark.asyncio
async def test_verbs_against_the_emulator(kube: KubeEmulator, tmp_path: pathlib.Path) -> None:
    errors: list[tuple[str, int]] = []
    creds = load_credentials(str(kube.write_kubeconfig(tmp_path / "kc")))
    async with KubeClient(creds, on_error=lambda verb, code: errors.append((verb, code))) as client:
        made = await client.create({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"},
                                    "metadata": {"name": "cm", "namespace": "default", "labels": {"x": "y"}}})
        assert made["metadata"]["uid"]
        patched = await client.patch("v1", "configmaps", "default", "cm", {"data": {"b": "2"}})
        assert patched["data"] == {"a": "1", "b": "2"}
        assert [o["metadata"]["name"] for o in await client.list("v1", "configmaps", "default", "x=y")] == ["cm"]
        assert await client.list("v1", "configmaps", "default", "x=z") == []
        event = await client.post_event(made, "Warning", "Test", "m" * 2000)
        assert event["involvedObject"]["uid"] == made["metadata"]["uid"] and len(event["message"]) == 1024
        with pytest.raises(KubeApiError) as exc:
            await client.create(made)
        assert (exc.value.code, exc.value.reason) == (409, "AlreadyExists")
        await client.delete("v1", "configmaps", "default", "cm")
        with pytest.raises(KubeApiError) as exc:
            await client.get("v1", "configmaps", "default", "cm")
        assert (exc.value.code, exc.value.reason) == (404, "NotFound")
    assert errors == [("post", 409), ("get", 404)]


@pytest.mark.asyncio
async def test_may_asks_the_api_server_like_kubectl_auth_can_i(kube: KubeEmulator, tmp_path: pathlib.Path) -> None:
    account = service_account("default", "reader")
    kube.create("rbac.authorization.k8s.io/v1", "roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}, "default")
    kube.create("rbac.authorization.k8s.io/v1", "rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "r"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}, "default")
    errors: list[tuple[str, int]] = []
    path = kube.write_kubeconfig(tmp_path / "kc", token=kube.add_token(account))
    async with KubeClient(load_credentials(str(path)), on_error=lambda v, c: errors.append((v, c))) as client:
        assert await client.may("list", "", "configmaps", "default") is True
        assert await client.may("list", "", "configmaps", "other") is False  # a Role grants in its namespace only
        assert await client.may("list", "", "namespaces") is False
    async with KubeClient(Credentials(server="http://127.0.0.1:9")) as client:  # nobody listens there
        assert await client.may("list", "", "namespaces") is None
    assert errors == []  # a refusal is an answer, not a failed request


@pytest.mark.asyncio
async def test_closed_client_says_how_to_open_it() -> None:
    with pytest.raises(RuntimeError, match="async with KubeClient"):
        await KubeClient(kube.Credentials(server="http://x")).get("v1", "configmaps", "d", "n")
