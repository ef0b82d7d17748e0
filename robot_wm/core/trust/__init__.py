"""The trust monitor's maths: signals, calibrated thresholds, the level state machine (numpy only).

``signals`` turns a world-model prediction and the state measured a period later into the
monitor's signals; ``calibration`` makes their thresholds from normal operation (conformal
quantiles) and keeps them per model version; ``monitor`` (``TrustMonitor``) runs one period.
"""
from robot_wm.core.trust.calibration import Calibration, CalibrationError, calibrate, conformal_quantile
from robot_wm.core.trust.monitor import TrustConfig, TrustMonitor, TrustOutput
from robot_wm.core.trust.signals import SIGNALS, Ewma, Signal, disagreement, prediction_error

__all__ = [
    "SIGNALS", "Calibration", "CalibrationError", "Ewma", "Signal", "TrustConfig", "TrustMonitor", "TrustOutput",
    "calibrate", "conformal_quantile", "disagreement", "prediction_error",
]
