"""The placement choices' saved form: `pod create --workspace` reaches the server through it (its body is
read back from the saved form there), and a run's saved request, whose slices are the run's, is unchanged."""

from __future__ import annotations

from tpuctl.services.placement_choices import PlacementChoices


def test_the_workspace_travels_only_when_given() -> None:
    asked = PlacementChoices(zones=("us-central1-a",), workspace="team-a")

    assert PlacementChoices.from_dict(asked.to_dict()) == asked
    assert "workspace" not in PlacementChoices().to_dict()
    assert PlacementChoices.from_dict(PlacementChoices().to_dict()).workspace is None
