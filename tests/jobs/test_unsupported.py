"""The SkyPilot keys tpuctl refuses are found wherever they sit, with the fix; allowed values pass."""

from __future__ import annotations

from tpuctl.jobs.unsupported import refused


def test_refused_keys_are_found_under_free_form_keys_and_list_items() -> None:
    data = {
        "num_nodes": 1,  # the one value allowed
        "resources": {"any_of": [{"accelerators": "a", "use_spot": True}],
                      "accelerator_args": {"tpu_vm": True}},
        "file_mounts": {"/data": {"source": "gs://b", "mode": "COPY"},
                        "/ckpt": {"source": "gs://c", "mode": "MOUNT"}},
        "envs": {"cpus": "4"},  # a variable's name, not a key of the format
    }  # fmt: skip
    found = dict(refused(data))
    assert set(found) == {("resources", "any_of", 0, "use_spot"), ("file_mounts", "/ckpt", "mode")}
    assert "COPY" in found[("file_mounts", "/ckpt", "mode")]
    assert dict(refused({"num_nodes": 4})).keys() == {("num_nodes",)}
