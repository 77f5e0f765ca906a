"""The TaskManager: joins the leader, keeps heartbeats going, leaves gracefully (later: runs tasks)."""

from .core import Registration, RegistrationConfig
from .process import TaskManager

__all__ = ["Registration", "RegistrationConfig", "TaskManager"]
