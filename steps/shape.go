package steps

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Shape describes the JSON a Go type decodes from, derived from the type
// by reflection (OutputShape). An outside call step records its output
// type's shape with its intent, so that an operator's output for it
// (stepwise resolve --as done --output JSON) is checked against the type
// the job will decode it into, at a time when only the store is at hand.
// Shapes are JSON themselves; String renders one for messages.
type Shape struct {
	// Type is "string", "integer", "number", "boolean", "object" (a
	// struct: Fields), "map" (string keys, Elem values), "array" (Elem
	// items) or "any" (anything is accepted: an interface, a
	// json.RawMessage, a type with its own UnmarshalJSON).
	Type string `json:"type"`
	// Go names the Go type, when it has a name (settlement.Receipt).
	Go string `json:"go,omitempty"`
	// Format narrows a string: "date-time" (RFC 3339, a time.Time),
	// "base64" ([]byte), "text" (a type with UnmarshalText), "quoted" (a
	// number or boolean in a string: the ",string" tag option); or names
	// "custom" for a type with its own UnmarshalJSON.
	Format string `json:"format,omitempty"`
	// Bits and Unsigned bound an integer (int8 … uint64).
	Bits     int  `json:"bits,omitempty"`
	Unsigned bool `json:"unsigned,omitempty"`
	// Nullable: null is accepted (a pointer, slice, map or interface).
	Nullable bool `json:"nullable,omitempty"`
	// Fields are an object's fields, by their JSON names, in order. Other
	// names are refused.
	Fields []ShapeField `json:"fields,omitempty"`
	// Elem is an array's item or a map's value shape.
	Elem *Shape `json:"elem,omitempty"`
}

// ShapeField is one field of an object Shape.
type ShapeField struct {
	Name  string `json:"name"`
	Shape *Shape `json:"shape"`
	// Optional: the field may be absent (omitempty or omitzero, or a
	// pointer). Other fields are required: the call's own output always
	// has them, and an absent one would decode as a silent zero.
	Optional bool `json:"optional,omitempty"`
}

var (
	shapeCache sync.Map // reflect.Type -> *Shape
	timeType   = reflect.TypeFor[time.Time]()
	jsonUnm    = reflect.TypeFor[json.Unmarshaler]()
	textUnm    = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// OutputShape is the shape of the JSON that encoding/json decodes into a
// value of type T.
func OutputShape[T any]() *Shape {
	t := reflect.TypeFor[T]()
	if s, ok := shapeCache.Load(t); ok {
		return s.(*Shape)
	}
	s := shapeOf(t, map[reflect.Type]bool{})
	shapeCache.Store(t, s)
	return s
}

// shapeOf derives t's shape; seen holds the named types being derived,
// so a recursive type ends in "any" instead of looping.
func shapeOf(t reflect.Type, seen map[reflect.Type]bool) *Shape {
	name := ""
	if t.Name() != "" {
		name = t.String()
	}
	if t.Kind() == reflect.Pointer {
		s := *shapeOf(t.Elem(), seen)
		s.Nullable = true
		return &s
	}
	switch {
	case t == timeType:
		return &Shape{Type: "string", Format: "date-time", Go: name}
	case t.Implements(jsonUnm) || reflect.PointerTo(t).Implements(jsonUnm):
		return &Shape{Type: "any", Format: "custom", Go: name, Nullable: true}
	case t.Implements(textUnm) || reflect.PointerTo(t).Implements(textUnm):
		return &Shape{Type: "string", Format: "text", Go: name}
	}
	switch t.Kind() {
	case reflect.String:
		return &Shape{Type: "string", Go: name}
	case reflect.Bool:
		return &Shape{Type: "boolean", Go: name}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return &Shape{Type: "integer", Bits: t.Bits(), Go: name}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return &Shape{Type: "integer", Bits: t.Bits(), Unsigned: true, Go: name}
	case reflect.Float32, reflect.Float64:
		return &Shape{Type: "number", Go: name}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Kind() == reflect.Slice {
			return &Shape{Type: "string", Format: "base64", Go: name, Nullable: true}
		}
		return &Shape{Type: "array", Elem: shapeOf(t.Elem(), seen), Go: name, Nullable: t.Kind() == reflect.Slice}
	case reflect.Map:
		return &Shape{Type: "map", Elem: shapeOf(t.Elem(), seen), Go: name, Nullable: true}
	case reflect.Struct:
		if seen[t] {
			return &Shape{Type: "any", Format: "recursive", Go: name}
		}
		seen[t] = true
		defer delete(seen, t)
		s := &Shape{Type: "object", Go: name}
		s.Fields = structFields(t, seen)
		return s
	}
	// Interfaces, and what encoding/json cannot decode at all.
	return &Shape{Type: "any", Go: name, Nullable: true}
}

// structFields are the JSON fields of struct t as encoding/json sees
// them: exported, named by their tag, embedded structs without a tag name
// inlined (a name given twice keeps the first).
func structFields(t reflect.Type, seen map[reflect.Type]bool) []ShapeField {
	var out []ShapeField
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && !ft.Implements(jsonUnm) && !reflect.PointerTo(ft).Implements(jsonUnm) && ft != timeType {
				for _, inner := range structFields(ft, seen) {
					if !names[inner.Name] {
						names[inner.Name] = true
						out = append(out, inner)
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		s := shapeOf(f.Type, seen)
		if strings.Contains(","+opts+",", ",string,") && (s.Type == "integer" || s.Type == "number" || s.Type == "boolean" || s.Type == "string") {
			q := *s
			q.Format = "quoted"
			s = &q
		}
		optional := f.Type.Kind() == reflect.Pointer || strings.Contains(","+opts+",", ",omitempty,") ||
			strings.Contains(","+opts+",", ",omitzero,")
		if !names[name] {
			names[name] = true
			out = append(out, ShapeField{Name: name, Shape: s, Optional: optional})
		}
	}
	return out
}

// String renders the shape for a message: {"id": string, "amount":
// integer (int64), "at": string (RFC 3339 time), "tags"?: [string]|null}
// ("?": the field may be absent).
func (s *Shape) String() string {
	var b strings.Builder
	s.write(&b, 0)
	return b.String()
}

func (s *Shape) write(b *strings.Builder, depth int) {
	switch s.Type {
	case "object":
		if depth > 4 {
			b.WriteString("{…}")
			break
		}
		b.WriteString("{")
		for i, f := range s.Fields {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(b, "%q", f.Name)
			if f.Optional {
				b.WriteString("?")
			}
			b.WriteString(": ")
			f.Shape.write(b, depth+1)
		}
		b.WriteString("}")
	case "array":
		b.WriteString("[")
		s.Elem.write(b, depth+1)
		b.WriteString("]")
	case "map":
		b.WriteString("{string: ")
		s.Elem.write(b, depth+1)
		b.WriteString("}")
	case "integer":
		b.WriteString("integer")
		if s.Bits > 0 {
			u := ""
			if s.Unsigned {
				u = "u"
			}
			fmt.Fprintf(b, " (%sint%d)", u, s.Bits)
		}
	default:
		b.WriteString(s.Type)
	}
	switch s.Format {
	case "date-time":
		b.WriteString(" (RFC 3339 time)")
	case "base64":
		b.WriteString(" (base64)")
	case "quoted":
		b.WriteString(" (in a string)")
	case "custom":
		b.WriteString(" (" + s.Go + " decodes it itself)")
	}
	if s.Nullable && s.Type != "any" {
		b.WriteString("|null")
	}
}

// ErrShape is wrapped by the error CheckShape returns for JSON that does
// not fit a shape.
var ErrShape = errors.New("steps: the value does not fit the output type")

// CheckShape checks that data, one JSON value, decodes into the type s
// was derived from, strictly: no field the type does not have, every
// field it has unless optional, no value of another JSON type, no integer
// out of range or with a fraction, no null where the type has no nil. The error names the first place that
// does not fit, wrapping ErrShape.
func CheckShape(s *Shape, data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%w: not JSON: %w", ErrShape, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: more than one JSON value", ErrShape)
	}
	return s.check("$", v)
}

func (s *Shape) check(path string, v any) error {
	if v == nil {
		if s.Nullable || s.Type == "any" {
			return nil
		}
		return s.mismatch(path, v)
	}
	switch s.Type {
	case "any":
		return nil
	case "string":
		str, ok := v.(string)
		if !ok {
			return s.mismatch(path, v)
		}
		return s.checkString(path, str)
	case "boolean":
		if _, ok := v.(bool); !ok {
			return s.mismatch(path, v)
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			return s.mismatch(path, v)
		}
		return s.checkNumber(path, n.String())
	case "array":
		items, ok := v.([]any)
		if !ok {
			return s.mismatch(path, v)
		}
		for i, item := range items {
			if err := s.Elem.check(fmt.Sprintf("%s[%d]", path, i), item); err != nil {
				return err
			}
		}
	case "map":
		obj, ok := v.(map[string]any)
		if !ok {
			return s.mismatch(path, v)
		}
		for k, item := range obj {
			if err := s.Elem.check(path+"."+k, item); err != nil {
				return err
			}
		}
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return s.mismatch(path, v)
		}
		return s.checkFields(path, obj)
	}
	return nil
}

func (s *Shape) checkFields(path string, obj map[string]any) error {
	byName := make(map[string]*Shape, len(s.Fields))
	names := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		byName[f.Name], names[i] = f.Shape, f.Name
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	// In a stable order, so the error names the same field every time.
	slices.Sort(keys)
	for _, k := range keys {
		f, ok := byName[k]
		if !ok {
			return fmt.Errorf("%w: %s has no field %q (its fields: %s)", ErrShape, path, k, strings.Join(names, ", "))
		}
		if err := f.check(path+"."+k, obj[k]); err != nil {
			return err
		}
	}
	for _, f := range s.Fields {
		if _, ok := obj[f.Name]; !ok && !f.Optional {
			return fmt.Errorf("%w: %s lacks field %q (%s): only fields marked ? may be left out", ErrShape, path, f.Name, f.Shape)
		}
	}
	return nil
}

func (s *Shape) checkString(path, str string) error {
	switch s.Format {
	case "date-time":
		if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
			return fmt.Errorf("%w: %s is %q, not an RFC 3339 time", ErrShape, path, str)
		}
	case "quoted":
		if _, err := strconv.ParseFloat(str, 64); err != nil && str != "true" && str != "false" {
			return fmt.Errorf("%w: %s is %q, not a number or boolean in a string", ErrShape, path, str)
		}
	case "base64":
		if _, err := base64.StdEncoding.DecodeString(str); err != nil {
			return fmt.Errorf("%w: %s is not base64: %w", ErrShape, path, err)
		}
	}
	return nil
}

func (s *Shape) checkNumber(path, n string) error {
	if s.Type == "number" {
		if _, err := strconv.ParseFloat(n, 64); err != nil {
			return fmt.Errorf("%w: %s is %s, out of range for a number", ErrShape, path, n)
		}
		return nil
	}
	bits := s.Bits
	if bits == 0 {
		bits = 64
	}
	var err error
	if s.Unsigned {
		_, err = strconv.ParseUint(n, 10, bits)
	} else {
		_, err = strconv.ParseInt(n, 10, bits)
	}
	if err != nil {
		return fmt.Errorf("%w: %s is %s, not an integer that fits %s", ErrShape, path, n, s.String())
	}
	return nil
}

func (s *Shape) mismatch(path string, v any) error {
	return fmt.Errorf("%w: %s is %s, want %s", ErrShape, path, jsonKind(v), s.String())
}

// jsonKind names a decoded JSON value's type.
func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "the number " + v.String()
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
