"""The native protocol, without I/O: frames and the frame reader."""

from .frames import FrameType, decode_body, encode
from .reader import BadFrame, FrameReader

__all__ = ["BadFrame", "FrameReader", "FrameType", "decode_body", "encode"]
