"""robot_wm.nodes."""
