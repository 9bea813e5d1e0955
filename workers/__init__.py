"""Role workers of the RLHF loop: actor, critic, reference and reward.

Each is a :class:`rlhfctl.single_controller.Worker` constructed as ``Cls(recipe, role)`` and driven
through a worker group by its ``@register``-ed methods; ``docs/workers.md`` lists them with their
dispatch modes and DataProto keys.
"""

from workers.actor import ActorWorker
from workers.critic import CriticWorker
from workers.reference import ReferenceWorker
from workers.reward import RewardWorker
from rlhfctl.rewards.functions import RewardFunctionError
from workers.role import RoleWorker

__all__ = [
    "ActorWorker",
    "CriticWorker",
    "ReferenceWorker",
    "RewardFunctionError",
    "RewardWorker",
    "RoleWorker",
]
