"""The policy layer: permission modes the kernel enforces, and durable human approvals.

    system = await stead.open("sqlite:///stead.db", approvals=True)
    for a in await system.approvals():            # pending requests, oldest first
        await system.approve(a.id, note="ok")      # or system.reject(a.id, note="not that file")

See docs/approvals.md. `PolicyPlugin` is the plugin (`stead.open(approvals=True)` adds one; definitions
add one automatically); `DEFAULT_TABLE` the mode table; `Rules` allow / ask / deny patterns; `decide` the
pure verdict for one call.
"""

from stead.policy._modes import DEFAULT_TABLE, Rules, Verdict, decide
from stead.policy._plugin import PERMISSIONS_KEY, PolicyPlugin

__all__ = ["DEFAULT_TABLE", "PERMISSIONS_KEY", "PolicyPlugin", "Rules", "Verdict", "decide"]
