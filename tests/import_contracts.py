"""import-linter contract types of tunebench's own (``[tool.importlinter] contract_types``).

``module_acyclic``: no cycle of imports between modules under ``root`` (a module imported
inside a function counts: a lazy import hides a cycle, it does not remove it). import-linter's
own ``acyclic_siblings`` squashes each package into one node, so it also reports packages that
merely use each other's modules, which is no cycle."""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def module_cycles(graph: ImportGraph, root: str) -> list[list[str]]:
    """The strongly connected groups (two modules or more) of the import graph under ``root``."""
    modules = sorted(m for m in graph.modules if m == root or m.startswith(root + "."))
    inside = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (deep packages need no recursion limit)
        work = [(start, 0)]
        while work:
            node, next_edge = work.pop()
            if next_edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for i in range(next_edge, len(edges[node])):
                target = edges[node][i]
                if target not in index:
                    work.append((node, i + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])

    for module in modules:
        if module not in index:
            visit(module)
    return sorted(groups)


class ModuleAcyclicContract(Contract):
    type_name = "module_acyclic"

    root = fields.StringField()

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        cycles = module_cycles(graph, str(self.root))
        details = {" <-> ".join(group): [f"{a} -> {b} (line {d['line_number']})"
                                         for a in group for b in group if a != b
                                         for d in graph.get_import_details(importer=a, imported=b)]
                   for group in cycles}
        return ContractCheck(kept=not cycles, metadata={"cycles": details})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group, imports in check.metadata["cycles"].items():
            output.print_error(f"Modules that import each other: {group}")
            for line in imports:
                output.print_error(f"- {line}")
            output.new_line()
