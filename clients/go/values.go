package featurestore

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	pb "github.com/feature-store/feature-store/clients/go/featurestorepb"
)

// Decode is a Value as the REST API answers it: float64, int64, bool, string, []float32,
// []int64, or nil (no kind: missing).
func Decode(v *pb.Value) any {
	switch k := v.GetKind().(type) {
	case *pb.Value_FloatValue:
		return k.FloatValue
	case *pb.Value_IntValue:
		return k.IntValue
	case *pb.Value_BoolValue:
		return k.BoolValue
	case *pb.Value_StringValue:
		return k.StringValue
	case *pb.Value_FloatList:
		return k.FloatList.GetValues()
	case *pb.Value_IntList:
		return k.IntList.GetValues()
	}
	return nil
}

// Encode is the Value of a Go value to write; nil removes the feature.
func Encode(value any) (*pb.Value, error) {
	switch v := value.(type) {
	case nil:
		return &pb.Value{}, nil
	case float64:
		return &pb.Value{Kind: &pb.Value_FloatValue{FloatValue: v}}, nil
	case float32:
		return &pb.Value{Kind: &pb.Value_FloatValue{FloatValue: float64(v)}}, nil
	case int64:
		return &pb.Value{Kind: &pb.Value_IntValue{IntValue: v}}, nil
	case int:
		return &pb.Value{Kind: &pb.Value_IntValue{IntValue: int64(v)}}, nil
	case bool:
		return &pb.Value{Kind: &pb.Value_BoolValue{BoolValue: v}}, nil
	case string:
		return &pb.Value{Kind: &pb.Value_StringValue{StringValue: v}}, nil
	case []float32:
		return &pb.Value{Kind: &pb.Value_FloatList{FloatList: &pb.FloatList{Values: v}}}, nil
	case []int64:
		return &pb.Value{Kind: &pb.Value_IntList{IntList: &pb.IntList{Values: v}}}, nil
	}
	return nil, fmt.Errorf("no feature type holds a %T", value)
}

// JSON is a decoded value in the REST API's JSON: numbers, arrays, null, and a float that
// is NaN or infinite as the string "NaN", "Infinity" or "-Infinity".
type JSON struct{ Value any }

// MarshalJSON writes floats at their own precision: float64 (float and double features)
// as the shortest text that round-trips, float32 (list elements) as float32's.
func (j JSON) MarshalJSON() ([]byte, error) {
	switch v := j.Value.(type) {
	case float64:
		return floatJSON(nil, v, 64), nil
	case []float32:
		out := []byte{'['}
		for i, x := range v {
			if i > 0 {
				out = append(out, ',')
			}
			out = floatJSON(out, float64(x), 32)
		}
		return append(out, ']'), nil
	case []int64:
		if v == nil {
			return []byte("[]"), nil
		}
	}
	return json.Marshal(j.Value)
}

func floatJSON(out []byte, x float64, bits int) []byte {
	switch {
	case math.IsNaN(x):
		return append(out, `"NaN"`...)
	case math.IsInf(x, 1):
		return append(out, `"Infinity"`...)
	case math.IsInf(x, -1):
		return append(out, `"-Infinity"`...)
	}
	return strconv.AppendFloat(out, x, 'g', -1, bits)
}

// Object is a JSON object whose members keep their order (json.Marshal of a map sorts them).
type Object []Member

// Member of an Object.
type Member struct {
	Name  string
	Value any
}

// MarshalJSON writes the members in order.
func (o Object) MarshalJSON() ([]byte, error) {
	out := []byte{'{'}
	for i, m := range o {
		if i > 0 {
			out = append(out, ',')
		}
		name, err := json.Marshal(m.Name)
		if err != nil {
			return nil, err
		}
		value, err := json.Marshal(m.Value)
		if err != nil {
			return nil, err
		}
		out = append(append(append(out, name...), ':'), value...)
	}
	return append(out, '}'), nil
}
