"""The one error type of bad Hogwild input. Pure, no vLLM import."""

from __future__ import annotations


class HogwildOptionError(ValueError):
    """A bad Hogwild option or setting: ``parameter`` names the field, ``message`` says what is wrong.

    ``str(err)`` is ``"<parameter>: <message>"``. Code that re-raises under
    another field name reads the two attributes, never the string.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message

    def renamed(self, parameter: str) -> "HogwildOptionError":
        """The same error, reported under another field name (a flag, a nested key)."""
        return HogwildOptionError(parameter, self.message)
