"""The row and column layout of the safety filter's QP, typed (no index arithmetic scattered around).

Rows, top to bottom::

    box      n   per-joint command interval (speed, acceleration, merged joint-limit bounds)  HARD
    pos      n   joint-position CBF rows (world model: coupled through B)                      HARD
    brake    n   joint-limit braking rows on the predicted velocity (world model)              HARD
    speed   26   tool-speed polytope                                                           soft
    ws       W   workspace barriers (points x obstacles)                                       soft
    force    1   contact force (hard above the force limit: retreat)                           soft
    slack    3   s >= 0 for the three soft families

Columns: the n joint velocities u, then the slacks of the workspace, tool-speed and force rows.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowLayout:
    """Where each family's rows and the slack columns are."""

    n: int
    box: slice
    pos: slice
    brake: slice
    speed: slice
    ws: slice
    force: int
    slack: slice
    m: int  # rows
    nx: int  # columns: u, then the slacks
    col_slack_ws: int
    col_slack_speed: int
    col_slack_force: int

    @classmethod
    def build(cls, n_joints: int, n_speed: int, n_workspace: int) -> "RowLayout":
        """The layout for ``n_joints`` joints, ``n_speed`` polytope faces and ``n_workspace`` barriers."""
        n = n_joints
        r_speed = 3 * n
        r_ws = r_speed + n_speed
        r_force = r_ws + n_workspace
        r_slack = r_force + 1
        return cls(
            n=n, box=slice(0, n), pos=slice(n, 2 * n), brake=slice(2 * n, 3 * n),
            speed=slice(r_speed, r_ws), ws=slice(r_ws, r_force), force=r_force, slack=slice(r_slack, r_slack + 3),
            m=r_slack + 3, nx=n + 3, col_slack_ws=n, col_slack_speed=n + 1, col_slack_force=n + 2,
        )

    @property
    def hard(self) -> slice:
        """The hard rows: box, position and braking."""
        return slice(self.box.start, self.brake.stop)

    @property
    def coupled(self) -> slice:
        """The hard rows that couple joints through the world model: position and braking."""
        return slice(self.pos.start, self.brake.stop)

    @property
    def soft(self) -> slice:
        """The soft rows: tool speed, workspace, force."""
        return slice(self.speed.start, self.force + 1)
