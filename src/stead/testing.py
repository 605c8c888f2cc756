"""`stead.testing`: deterministic models and fault injection for tests, demos and benchmarks.

- `ScriptedProvider(respond)`: a provider whose responses come from a function (or a list) — no network,
  the same answer every time; unless a response sets `usage`, it reports the request's input tokens as
  stead estimates them (`stead.core.tokens`), so automatic compaction triggers in tests as with a server;
  `load_scripted_model(path)` builds one from a scripted model file (YAML).
- `Faults(crash_at=N)` / `Faults(flaky=p)`: make a store die at its N-th operation (as if the process were
  killed there) or fail transiently at random: `stead.open(url, faults=Faults(crash_at=7))`. After an
  injected crash every store operation raises `StoreCrashed`.
- `check_store(factory)`: the store contract suite (`stead.store.contract`): run it from a test against
  the store `factory()` opens (the same database each call) to prove a store — an outside one registered
  in the `stead.stores` entry point group, or a built-in — keeps every promise of `stead.extend.Store`;
  a broken promise raises `AssertionError` naming it.
"""

from stead.errors import StoreCrashed
from stead.providers.scripted import ScriptedProvider, ScriptedResponse
from stead.providers.scripted_file import load_scripted_model
from stead.store.contract import check_store
from stead.store.faults import Faults

__all__ = [
    "Faults",
    "ScriptedProvider",
    "ScriptedResponse",
    "StoreCrashed",
    "check_store",
    "load_scripted_model",
]

for _name in ("Faults", "ScriptedProvider", "ScriptedResponse", "check_store", "load_scripted_model"):
    globals()[_name].__module__ = "stead.testing"
del _name
