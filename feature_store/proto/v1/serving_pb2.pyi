import datetime

from feature_store.proto.v1 import values_pb2 as _values_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    PRESENT: _ClassVar[Status]
    MISSING: _ClassVar[Status]
    STALE: _ClassVar[Status]
    ERROR: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
PRESENT: Status
MISSING: Status
STALE: Status
ERROR: Status

class EntityId(_message.Message):
    __slots__ = ("int_id", "string_id")
    INT_ID_FIELD_NUMBER: _ClassVar[int]
    STRING_ID_FIELD_NUMBER: _ClassVar[int]
    int_id: int
    string_id: str
    def __init__(self, int_id: _Optional[int] = ..., string_id: _Optional[str] = ...) -> None: ...

class GetFeaturesRequest(_message.Message):
    __slots__ = ("entity_type", "int_ids", "string_ids", "features", "groups", "bypass_cache")
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    INT_IDS_FIELD_NUMBER: _ClassVar[int]
    STRING_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    BYPASS_CACHE_FIELD_NUMBER: _ClassVar[int]
    entity_type: str
    int_ids: _containers.RepeatedScalarFieldContainer[int]
    string_ids: _containers.RepeatedScalarFieldContainer[str]
    features: _containers.RepeatedScalarFieldContainer[str]
    groups: _containers.RepeatedScalarFieldContainer[str]
    bypass_cache: bool
    def __init__(self, entity_type: _Optional[str] = ..., int_ids: _Optional[_Iterable[int]] = ..., string_ids: _Optional[_Iterable[str]] = ..., features: _Optional[_Iterable[str]] = ..., groups: _Optional[_Iterable[str]] = ..., bypass_cache: _Optional[bool] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("float_value", "int_value", "bool_value", "string_value", "float_list", "int_list")
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_LIST_FIELD_NUMBER: _ClassVar[int]
    INT_LIST_FIELD_NUMBER: _ClassVar[int]
    float_value: float
    int_value: int
    bool_value: bool
    string_value: str
    float_list: _values_pb2.FloatList
    int_list: _values_pb2.IntList
    def __init__(self, float_value: _Optional[float] = ..., int_value: _Optional[int] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ..., float_list: _Optional[_Union[_values_pb2.FloatList, _Mapping]] = ..., int_list: _Optional[_Union[_values_pb2.IntList, _Mapping]] = ...) -> None: ...

class FeatureRow(_message.Message):
    __slots__ = ("id", "values", "statuses", "ages")
    class AgesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    AGES_FIELD_NUMBER: _ClassVar[int]
    id: EntityId
    values: _containers.RepeatedCompositeFieldContainer[Value]
    statuses: _containers.RepeatedScalarFieldContainer[Status]
    ages: _containers.ScalarMap[str, int]
    def __init__(self, id: _Optional[_Union[EntityId, _Mapping]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., statuses: _Optional[_Iterable[_Union[Status, str]]] = ..., ages: _Optional[_Mapping[str, int]] = ...) -> None: ...

class EntityError(_message.Message):
    __slots__ = ("id", "group", "reason", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: EntityId
    group: str
    reason: str
    message: str
    def __init__(self, id: _Optional[_Union[EntityId, _Mapping]] = ..., group: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GetFeaturesResponse(_message.Message):
    __slots__ = ("entity_type", "features", "rows", "errors")
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    entity_type: str
    features: _containers.RepeatedScalarFieldContainer[str]
    rows: _containers.RepeatedCompositeFieldContainer[FeatureRow]
    errors: _containers.RepeatedCompositeFieldContainer[EntityError]
    def __init__(self, entity_type: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ..., rows: _Optional[_Iterable[_Union[FeatureRow, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[EntityError, _Mapping]]] = ...) -> None: ...

class WriteRow(_message.Message):
    __slots__ = ("id", "values", "event_time")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    id: EntityId
    values: _containers.MessageMap[str, Value]
    event_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[_Union[EntityId, _Mapping]] = ..., values: _Optional[_Mapping[str, Value]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WriteFeaturesRequest(_message.Message):
    __slots__ = ("group", "rows")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    group: str
    rows: _containers.RepeatedCompositeFieldContainer[WriteRow]
    def __init__(self, group: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[WriteRow, _Mapping]]] = ...) -> None: ...

class WriteFeaturesResponse(_message.Message):
    __slots__ = ("entities", "values_written", "values_removed", "skipped", "skipped_ids")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    VALUES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    VALUES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_IDS_FIELD_NUMBER: _ClassVar[int]
    entities: int
    values_written: int
    values_removed: int
    skipped: int
    skipped_ids: _containers.RepeatedCompositeFieldContainer[EntityId]
    def __init__(self, entities: _Optional[int] = ..., values_written: _Optional[int] = ..., values_removed: _Optional[int] = ..., skipped: _Optional[int] = ..., skipped_ids: _Optional[_Iterable[_Union[EntityId, _Mapping]]] = ...) -> None: ...

class GetRegistryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FeatureInfo(_message.Message):
    __slots__ = ("name", "type", "dim", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    dim: int
    description: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., dim: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class EntityTypeInfo(_message.Message):
    __slots__ = ("name", "prefix", "id_type", "ttl_seconds", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    ID_TYPE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    prefix: str
    id_type: str
    ttl_seconds: int
    description: str
    def __init__(self, name: _Optional[str] = ..., prefix: _Optional[str] = ..., id_type: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class FeatureGroupInfo(_message.Message):
    __slots__ = ("name", "entity_type", "max_age_seconds", "description", "features")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    name: str
    entity_type: str
    max_age_seconds: int
    description: str
    features: _containers.RepeatedCompositeFieldContainer[FeatureInfo]
    def __init__(self, name: _Optional[str] = ..., entity_type: _Optional[str] = ..., max_age_seconds: _Optional[int] = ..., description: _Optional[str] = ..., features: _Optional[_Iterable[_Union[FeatureInfo, _Mapping]]] = ...) -> None: ...

class GetRegistryResponse(_message.Message):
    __slots__ = ("entities", "groups")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[EntityTypeInfo]
    groups: _containers.RepeatedCompositeFieldContainer[FeatureGroupInfo]
    def __init__(self, entities: _Optional[_Iterable[_Union[EntityTypeInfo, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[FeatureGroupInfo, _Mapping]]] = ...) -> None: ...
