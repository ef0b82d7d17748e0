"""robot_wm.core."""
