"""The projector: folds fact streams into read-model tables in Redis, exactly once."""

from .core import PROJECTIONS, Projection
from .process import Projector

__all__ = ["PROJECTIONS", "Projection", "Projector"]
