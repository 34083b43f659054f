"""The engine's HTTP face: OpenAI-compatible and admin API, its settings, metrics and the
asyncio loop that feeds the core one iteration at a time."""
