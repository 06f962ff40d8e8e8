"""The emulator's partial-response field masks (the reaper relies on them to keep listings small)."""

import pytest

from include.emulators.gce import fieldmask

PAGE = {
    "kind": "compute#instanceAggregatedList",
    "items": {
        "zones/a": {"instances": [{"name": "x", "id": "1", "disks": [{"boot": True}], "labels": {"k": "v"}}]},
        "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
    },
    "nextPageToken": "t",
}


def test_nested_selection_with_wildcard() -> None:
    tree = fieldmask.parse("items/*/instances(name,labels),items/*/warning,nextPageToken")
    assert fieldmask.apply(PAGE, tree) == {
        "items": {
            "zones/a": {"instances": [{"name": "x", "labels": {"k": "v"}}]},
            "zones/b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
        },
        "nextPageToken": "t",
    }


def test_flat_selection() -> None:
    assert fieldmask.apply({"id": "1", "name": "n", "status": "RUNNING"}, fieldmask.parse("id, status")) == {
        "id": "1",
        "status": "RUNNING",
    }


@pytest.mark.parametrize("mask", ["items(", "a,,b", "items/(x)", "a)"])
def test_invalid_masks_are_refused(mask: str) -> None:
    with pytest.raises(ValueError, match="field mask"):
        fieldmask.parse(mask)
