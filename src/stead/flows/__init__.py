"""Flows (docs/flows.md): deterministic agents of steps and paths, run payloads, and the opt-in built-in
tools of loop agents (scratchpad, pipelines, artifacts)."""
