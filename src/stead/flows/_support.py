"""What the orchestration plugin asks of a flow definition: its engine's provider name, whether it has prompt
steps (which need a model), and its payload rules."""

from __future__ import annotations

from typing import Any

from stead.flows._paths import Pattern
from stead.flows._schema import FlowDefinition

__all__ = ["flow_key", "has_prompt", "payload_rules_of"]


def payload_rules_of(definition: FlowDefinition | None) -> tuple[list[Pattern] | None, list[Pattern] | None]:
    """A definition's (read, write) payload patterns (None: unrestricted)."""
    rules = definition.payload if definition is not None else None
    if rules is None:
        return None, None
    return rules._read, rules._write


def flow_key(name: str) -> str:
    """The provider name of a flow definition's engine."""
    return f"flow/{name}"


def has_prompt(definition: FlowDefinition) -> bool:
    def body_has(step: Any) -> bool:
        return step.prompt is not None

    for s in definition.steps:
        if body_has(s) or (s.for_each is not None and body_has(s.for_each.do)):
            return True
        if s.while_ is not None and body_has(s.while_.do):
            return True
    return False
