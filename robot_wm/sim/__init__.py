"""robot_wm.sim."""
