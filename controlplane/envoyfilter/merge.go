package envoyfilter

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

// Merge merges src into dst with Istio's EnvoyFilter MERGE semantics: proto merge (set scalars
// and messages of src overwrite, repeated fields append, map entries replace), except that a
// Duration is replaced as a whole (proto merge would keep dst's nanos when src has none) and an
// Any holding the same type on both sides is merged as the message it holds (Istio merges
// filter typed_configs and transport sockets this way); an Any of another type replaces dst's.
// With replaceLists (MERGE_AND_REPLACE_LIST) repeated fields of src replace dst's at the top
// level; inside merged typed configs lists still append, as in Istio.
func Merge(dst, src proto.Message, replaceLists bool) error {
	d, s := dst.ProtoReflect(), src.ProtoReflect()
	if d.Descriptor().FullName() != s.Descriptor().FullName() {
		return fmt.Errorf("cannot merge %s into %s", s.Descriptor().FullName(), d.Descriptor().FullName())
	}
	return mergeMessage(d, s, replaceLists)
}

var durationName = (&durationpb.Duration{}).ProtoReflect().Descriptor().FullName()

func mergeMessage(dst, src protoreflect.Message, replaceLists bool) error {
	var err error
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			if replaceLists {
				dst.Clear(fd)
			}
			l := dst.Mutable(fd).List()
			sl := v.List()
			for i := 0; i < sl.Len(); i++ {
				l.Append(cloneValue(fd, sl.Get(i)))
			}
		case fd.IsMap():
			m := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				m.Set(k, cloneValue(fd.MapValue(), mv))
				return true
			})
		case fd.Message() != nil:
			err = mergeField(dst, fd, v.Message())
		case fd.Kind() == protoreflect.BytesKind:
			dst.Set(fd, protoreflect.ValueOfBytes(append([]byte(nil), v.Bytes()...)))
		default:
			dst.Set(fd, v)
		}
		return err == nil
	})
	return err
}

func mergeField(dst protoreflect.Message, fd protoreflect.FieldDescriptor, src protoreflect.Message) error {
	if fd.Message().FullName() == durationName || !dst.Has(fd) {
		dst.Set(fd, protoreflect.ValueOfMessage(proto.Clone(src.Interface()).ProtoReflect()))
		return nil
	}
	if sa, ok := src.Interface().(*anypb.Any); ok {
		da := dst.Get(fd).Message().Interface().(*anypb.Any)
		if da.GetTypeUrl() != sa.GetTypeUrl() {
			dst.Set(fd, protoreflect.ValueOfMessage(proto.Clone(sa).ProtoReflect()))
			return nil
		}
		merged, err := MergeAny(da, sa)
		if err != nil {
			return err
		}
		dst.Set(fd, protoreflect.ValueOfMessage(merged.ProtoReflect()))
		return nil
	}
	return mergeMessage(dst.Mutable(fd).Message(), src, false)
}

// MergeAny merges two Anys of the same type as the messages they hold.
func MergeAny(dst, src *anypb.Any) (*anypb.Any, error) {
	if dst.GetTypeUrl() != src.GetTypeUrl() {
		return nil, fmt.Errorf("typed_config %s cannot be merged into %s", src.GetTypeUrl(), dst.GetTypeUrl())
	}
	d, err := envoytypes.Unpack(dst)
	if err != nil {
		return nil, err
	}
	s, err := envoytypes.Unpack(src)
	if err != nil {
		return nil, err
	}
	if err := mergeMessage(d.ProtoReflect(), s.ProtoReflect(), false); err != nil {
		return nil, err
	}
	return pack(d)
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// pack is anypb.New with deterministic encoding, so equal configs hash equally.
func pack(m proto.Message) (*anypb.Any, error) {
	b, err := deterministic.Marshal(m)
	if err != nil {
		return nil, err
	}
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName()), Value: b}, nil
}

func cloneValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch {
	case fd.Message() != nil:
		return protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect())
	case fd.Kind() == protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(append([]byte(nil), v.Bytes()...))
	}
	return v
}
