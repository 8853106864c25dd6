"""Replica discovery: pure translation of Endpoints/EndpointSlice objects, and the
list-then-watch loop over a fake API (the real kube-apiserver test is separate)."""

import threading

from anchorage.router.discovery import KubernetesSource, pods_from, urls_from

EP = {"metadata": {"name": "vllm"}, "subsets": [
    {"addresses": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}], "notReadyAddresses": [{"ip": "10.0.0.9"}]}]}
SLICE = {"metadata": {"name": "vllm-abc"}, "endpoints": [
    {"addresses": ["10.0.1.1"], "conditions": {"ready": True}},
    {"addresses": ["10.0.1.2"], "conditions": {"ready": False}},
    {"addresses": ["10.0.1.3"]}]}


def test_urls_from_ready_addresses_only():
    assert urls_from([EP], "Endpoints", 8000) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert urls_from([SLICE], "EndpointSlice", 80) == ["http://10.0.1.1:80", "http://10.0.1.3:80"]


def test_pods_from_names_the_pod_behind_each_ready_address():
    ep = {"subsets": [{"addresses": [
        {"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "name": "llama-0"}},
        {"ip": "10.0.0.2"}],
        "notReadyAddresses": [{"ip": "10.0.0.9", "targetRef": {"kind": "Pod", "name": "x"}}]}]}
    assert pods_from([ep], "Endpoints", 8000) == {"http://10.0.0.1:8000": "llama-0"}
    sl = {"endpoints": [
        {"addresses": ["10.0.1.1"], "targetRef": {"kind": "Pod", "name": "llama-1"}},
        {"addresses": ["10.0.1.2"], "conditions": {"ready": False},
         "targetRef": {"kind": "Pod", "name": "not-ready"}}]}
    assert pods_from([sl], "EndpointSlice", 80) == {"http://10.0.1.1:80": "llama-1"}


class FakeAPI:
    def __init__(self):
        self.lists = 0

    def list(self, namespace, selector):
        self.lists += 1
        assert (namespace, selector) == ("ns", "app=vllm")
        return [EP], "41"

    def watch(self, namespace, selector, resource_version, timeout_s):
        assert resource_version == "41"
        if self.lists == 1:
            yield {"type": "MODIFIED", "object": {"metadata": {"name": "vllm"}, "subsets": [
                {"addresses": [{"ip": "10.0.0.1"}]}]}}
            yield {"type": "ADDED", "object": {"metadata": {"name": "other"}, "subsets": [
                {"addresses": [{"ip": "10.0.0.7"}]}]}}
            yield {"type": "DELETED", "object": {"metadata": {"name": "vllm"}}}
            yield {"type": "ERROR", "object": {"code": 410}}       # expired: re-list


def test_watch_follows_changes_and_relists_after_an_error():
    src = KubernetesSource(FakeAPI(), "ns", "app=vllm", 8000)
    seen = []

    def on_change(urls):
        seen.append(urls)
        if len(seen) == 5:
            src.stop()
    t = threading.Thread(target=src.watch, args=(on_change,))
    t.start()
    t.join(5)
    assert not t.is_alive()
    assert seen == [["http://10.0.0.1:8000", "http://10.0.0.2:8000"], ["http://10.0.0.1:8000"],
                    ["http://10.0.0.1:8000", "http://10.0.0.7:8000"], ["http://10.0.0.7:8000"],
                    ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]]
