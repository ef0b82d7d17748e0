"""The trust monitor's maths: signals, calibrated thresholds, the level state machine (numpy only).

``signals`` turns a world-model prediction and the state measured a period later into the
monitor's signals; ``effort`` models the drives' efforts of normal operation; ``calibration`` makes their thresholds from normal operation (conformal
quantiles) and keeps them per model version; ``monitor`` (``TrustMonitor``) runs one period.
"""
from robot_wm.core.trust.effort import EffortModel, EffortModelError
from robot_wm.core.trust.calibration import Calibration, CalibrationError, calibrate, conformal_quantile
from robot_wm.core.trust.monitor import TrustConfig, TrustMonitor, TrustOutput
from robot_wm.core.trust.signals import SIGNALS, Ewma, Signal, disagreement, prediction_error

__all__ = [
    "SIGNALS", "Calibration", "EffortModel", "EffortModelError", "CalibrationError", "Ewma", "Signal", "TrustConfig", "TrustMonitor", "TrustOutput",
    "calibrate", "conformal_quantile", "disagreement", "prediction_error",
]
