"""robot_wm.learning."""
