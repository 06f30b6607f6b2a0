"""The hang explainer: record collectives, watch for a stall, say who waits where and why."""
