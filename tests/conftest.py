import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore", category=UserWarning, module="tf_keras")
sys.path.insert(0, os.path.dirname(__file__))
