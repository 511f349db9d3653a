"""The engine-core process: the Hogwild scheduler and what it runs there."""
