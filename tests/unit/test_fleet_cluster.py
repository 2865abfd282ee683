"""What the Cluster box and ``tunebench cluster status`` call free, derived from Ray's public calls
only: a node's total less what placement groups hold there. And no product code reaches into
``ray._private`` (import-linter cannot forbid a subpackage of an external package)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from app.fleet.cluster import unreserved

ROOT = Path(__file__).resolve().parents[2]
NODE_A, NODE_B, GONE = "a" * 56, "b" * 56, "c" * 56


def group(state: str, bundles: list[dict[str, float]], placed_on: list[str]) -> dict[str, Any]:
    """A row of ``ray.util.placement_group_table()``, in Ray's shape."""
    return {"state": state, "bundles": dict(enumerate(bundles)), "bundles_to_node_id": dict(enumerate(placed_on))}


def totals() -> dict[str, dict[str, float]]:
    return {NODE_A: {"CPU": 8.0, "GPU": 2.0, "memory": 1e9, "node_a": 1.0}, NODE_B: {"CPU": 4.0}}


def test_without_placement_groups_everything_is_free() -> None:
    assert unreserved(totals(), []) == totals()


def test_placed_bundles_hold_their_nodes_resources() -> None:
    trial = group("CREATED", [{"CPU": 2.0, "GPU": 1.0, "node_a": 0.001}], [NODE_A])
    clients = group("CREATED", [{"CPU": 1.0}, {"CPU": 1.0}], [NODE_A, NODE_B])
    free = unreserved(totals(), [trial, clients])
    assert free[NODE_A] == {"CPU": 5.0, "GPU": 1.0, "memory": 1e9, "node_a": 0.999}
    assert free[NODE_B] == {"CPU": 3.0}


def test_only_groups_that_hold_resources_count() -> None:
    held = [group(state, [{"CPU": 1.0}], [NODE_B]) for state in ("PREPARED", "CREATED", "RESCHEDULING")]
    not_held = [group(state, [{"CPU": 1.0}], [NODE_B]) for state in ("PENDING", "REMOVED")]
    assert unreserved(totals(), held + not_held)[NODE_B] == {"CPU": 1.0}


def test_unplaced_bundles_and_unknown_nodes_change_nothing() -> None:
    pending_bundle = {"state": "RESCHEDULING", "bundles": {0: {"CPU": 3.0}}, "bundles_to_node_id": {}}
    on_a_gone_node = group("CREATED", [{"CPU": 3.0}], [GONE])
    assert unreserved(totals(), [pending_bundle, on_a_gone_node]) == totals()


def test_free_never_goes_below_zero_and_totals_stay_untouched() -> None:
    given = totals()
    free = unreserved(given, [group("CREATED", [{"CPU": 6.0}], [NODE_B])])
    assert free[NODE_B] == {"CPU": 0.0}
    assert given == totals()


def ray_private_uses(source: str) -> list[str]:
    """Every import of ``ray._private`` (in any form) and every ``ray._private`` attribute in a
    module's source, as "line: name"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute) and node.attr == "_private":
            names = [f"{ast.unparse(node.value)}._private"]
        found += [f"{node.lineno}: {name}" for name in names
                  if name == "ray._private" or name.startswith("ray._private.")]
    return found


def test_no_product_code_uses_rays_private_modules() -> None:
    """Ray's private modules change without notice between releases: app uses its public API only."""
    uses = {str(path.relative_to(ROOT)): ray_private_uses(path.read_text())
            for path in sorted((ROOT / "app").rglob("*.py"))}
    assert {path: lines for path, lines in uses.items() if lines} == {}


def test_the_private_check_sees_every_form() -> None:
    for source in ("import ray._private.state\n", "from ray._private.state import x\n",
                   "from ray import _private\n", "import ray\nray._private.state.x()\n"):
        assert ray_private_uses(source), source
    assert ray_private_uses("import ray\nfrom ray.util import placement_group_table\nray.nodes()\n") == []
