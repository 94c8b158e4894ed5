"""Membership: the pure SWIM + Lifeguard core (this package) and, later, its trio driver.

Import the core from here: :class:`Membership`, the presets :func:`lan` / :func:`local`, and the event/action
dataclasses from :mod:`.events`.
"""

from arceusd.membership.config import MembershipConfig, detection_bound, lan, local
from arceusd.membership.swim import Membership

__all__ = ["Membership", "MembershipConfig", "detection_bound", "lan", "local"]
