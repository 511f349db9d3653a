"""The checker of the plugin's touch points, against the installed vLLM or another release's sources. Development only.

- The table it checks is the package's own: :data:`vllm_hogwild.patches.TOUCH_POINTS`,
  one :class:`TouchPoint` per vLLM object the plugin imports, wraps,
  subclasses, calls, reads or writes (module, object, kind, the parameters it
  relies on, whether ``patches._wrap`` replaces it in the class's own
  ``__dict__``, where the plugin uses it, and its runtime hook if it has one),
  kept in ``vllm_hogwild/patches/`` beside the wraps (the upstream diffs: the
  checkout's top-level ``patches/``).
- :mod:`.check`: what each kind of touch point requires, one :class:`Checker`
  over a :class:`Reader`:

  - :mod:`.runtime` (:func:`check_runtime`) imports the installed vLLM and looks
    at the live objects (signatures, descriptors, dataclass/msgspec/pydantic
    fields, MROs); what only the source says (``self.x = ...`` in ``__init__``,
    a line a method must contain) it reads from the installed files of the
    classes' real MROs.
  - :mod:`.static` (:func:`check_static`) never imports vLLM: it parses the
    ``vllm/`` sources of any release (:mod:`.source`: module file, class, bases
    followed through imports and re-exports, methods and their parameters,
    decorators, ``async``, attributes assigned in the class body or ``__init__``,
    declared fields and their defaults, abstract methods, ``__slots__``/frozen/
    pydantic ``extra`` and ``validate_assignment``, a line a method must contain,
    the attributes a function reads of an argument the plugin replaces by a
    stand-in).

- :mod:`.fetch`: a release's sources from its PyPI wheel, and the upstream
  patches applied in order to a copy.
- :mod:`.cli`: ``python -m tools.upstream --runtime | --src DIR |
  --wheel VERSION [--patches [DIR]] [-q]`` (DIR: the checkout's ``patches/``).

Nothing here imports vLLM at module import time.
"""

from .check import CHANGED, MISSING, OK, Broken, Checker, Reader, Result
from .cli import main, report
from .fetch import (DEFAULT_INDEX, DEFAULT_JSON, check_patches, default_cache, extract_sources, fetch_sources,
                    find_wheel, pick_wheel)
from vllm_hogwild.patches.points import (ABSTRACT, ATTRIBUTE, CLASS, CONSTANT, ENV_VAR, FIELD, FUNCTION, INIT_ATTRIBUTE, KINDS, METHOD,
                    NO_DEFAULT, READS, SCHEDULER_OUTPUT_ATTRS, SETTABLE, SOURCE, TouchPoint)
from .runtime import RuntimeReader, check_runtime
from .source import SourceTree, release_version
from .static import StaticReader, check_static
from .syntax import ClassRef, External, Module
from vllm_hogwild.patches.touch_points import SET_ATTRIBUTES, TOUCH_POINTS

__all__ = [
    "ABSTRACT", "ATTRIBUTE", "CHANGED", "CLASS", "CONSTANT", "DEFAULT_INDEX", "DEFAULT_JSON", "ENV_VAR", "FIELD",
    "FUNCTION", "INIT_ATTRIBUTE", "KINDS", "METHOD", "MISSING", "NO_DEFAULT", "OK", "READS", "SCHEDULER_OUTPUT_ATTRS",
    "SET_ATTRIBUTES", "SETTABLE", "SOURCE", "TOUCH_POINTS", "Broken", "Checker", "ClassRef", "External", "Module",
    "Reader", "Result", "RuntimeReader", "SourceTree", "StaticReader", "TouchPoint", "check_patches", "check_runtime",
    "check_static", "default_cache", "extract_sources", "fetch_sources", "find_wheel", "main", "pick_wheel",
    "release_version", "report",
]
