"""Tools of examples/triage (in-memory stand-ins for an order system and a ticket desk)."""

import zlib

import stead

ORDERS = {
    1042: {"id": 1042, "customer": "ada@example.com", "total": 39.5, "status": "delivered"},
    2001: {"id": 2001, "customer": "bob@example.com", "total": 420.0, "status": "shipped"},
}


@stead.tool(durable=True)
async def lookup_order(order_id: int) -> dict:
    """Look an order up by its id (read-only, so safe to repeat)."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ValueError(f"no order {order_id}")
    return order


@stead.tool
async def issue_refund(order_id: int, amount: float, reason: str, ctx: stead.ToolContext) -> str:
    """Refund an order. Not durable: it runs at most once; a crash while it runs leaves it in doubt."""
    refund_id = await ctx.kv.get_or_create("refund", lambda: f"R-{order_id}")
    return f"Refunded ${amount:.2f} for order {order_id} ({reason}); refund {refund_id}."


@stead.tool(durable=True)
async def open_ticket(summary: str, ctx: stead.ToolContext) -> str:
    """Open a ticket for the human support desk (idempotent: the same call opens the same ticket)."""
    return await ctx.kv.get_or_create("ticket", lambda: f"T-{zlib.crc32(summary.encode()) % 10_000:04d}")
