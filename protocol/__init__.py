"""Kafka wire codec, sans-I/O: bytes in, objects out, and back.

==================  ============================================================
module              job
==================  ============================================================
``framing``         size-prefixed frames: ``FrameDecoder.feed``, ``encode_frame``
``headers``         request header v0-v2, response header v0/v1, version choice
``messages``        ``decode_request`` / ``encode_response`` over kio schemas
``entity_reader``   safe reader of kio entities (unknown tags, huge array counts)
``produce``         Produce request decode with records as views into the frame
``fetch``           Fetch response encode with records as separate buffers
``api_versions``    ApiVersions responses, KIP-511 answer to unknown versions
``record_batch``    magic-v2 batch header view, validation, in-place offsets
``records``         record-level parse/build with compression (aiokafka.record)
``control_records`` transaction markers: control key, marker value, marker batch
``errors``          ``ErrorCode`` and the codec's exceptions
``wire``            primitive types for the hand-written paths
==================  ============================================================
"""
