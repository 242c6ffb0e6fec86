"""gearshift.profile: per-layer model profiles (ModelProfile) and the profiler that measures them.

The profiler (torch) loads on first use of its names: the pure planner reads ModelProfile from here."""

from gearshift.imports import lazy_dir, lazy_exports
from gearshift.profile.model_profile import LayerProfile, ModelProfile

__all__ = ["LayerProfile", "ModelProfile", "print_profile", "profile_model"]
__getattr__ = lazy_exports(__name__, {"print_profile": "gearshift.profile.profiler",
                                      "profile_model": "gearshift.profile.profiler"})
__dir__ = lazy_dir(__name__)
