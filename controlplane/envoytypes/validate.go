package envoytypes

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

type validator interface{ ValidateAll() error }

// Validate runs Envoy's validation rules (protoc-gen-validate's ValidateAll, and the load-time
// rules of semantic.go) on m and on every message packed in an Any inside it, recursively: ValidateAll stops at an Any, but Envoy
// validates the typed config it unpacks, so an HTTP filter patched into a connection manager is
// only known to be valid once the manager's typed_config has been checked too. An Any of an
// unknown type is an error. Errors name the path of the Any they come from.
func Validate(m proto.Message) error {
	return validate(m, "")
}

func validate(m proto.Message, path string) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return wrap(path, err)
		}
	}
	if err := semantic(m); err != nil {
		return wrap(path, err)
	}
	return walk(m.ProtoReflect(), path)
}

func wrap(path string, err error) error {
	if path == "" {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}

func walk(msg protoreflect.Message, path string) error {
	var err error
	msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		name := join(path, string(fd.Name()))
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = field(l.Get(i).Message(), fmt.Sprintf("%s[%d]", name, i))
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = field(mv.Message(), fmt.Sprintf("%s[%s]", name, k.String()))
				return err == nil
			})
		default:
			err = field(v.Message(), name)
		}
		return err == nil
	})
	return err
}

func field(m protoreflect.Message, path string) error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		if err := semantic(m.Interface()); err != nil {
			return wrap(path, err)
		}
		return walk(m, path)
	}
	inner, err := Unpack(a)
	if err != nil {
		return wrap(path, err)
	}
	return validate(inner, fmt.Sprintf("%s (%s)", path, strings.TrimPrefix(a.GetTypeUrl(), "type.googleapis.com/")))
}

// Unpack returns the message an Any holds; an unknown type is an error naming it.
func Unpack(a *anypb.Any) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(a.GetTypeUrl())
	if err != nil {
		return nil, fmt.Errorf("unknown type %q", a.GetTypeUrl())
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(a.GetValue(), m); err != nil {
		return nil, fmt.Errorf("%s: %v", a.GetTypeUrl(), err)
	}
	return m, nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
