package config

import (
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

func validateWorkloadEntry(m proto.Message) *FieldError {
	return validateWorkloadEntryFields("", m.(*networking.WorkloadEntry))
}

func validateWorkloadEntryFields(prefix string, we *networking.WorkloadEntry) *FieldError {
	join := func(f string) string {
		if prefix == "" {
			return f
		}
		return prefix + "." + f
	}
	if we.GetAddress() == "" && we.GetNetwork() == "" {
		return fieldErr(join("address"), "an address is required")
	}
	for name, n := range we.GetPorts() {
		if fe := validatePortNumber(join("ports."+name), n, false); fe != nil {
			return fe
		}
	}
	if fe := validateLabels(join("labels"), we.GetLabels()); fe != nil {
		return fe
	}
	if w := we.GetWeight(); w > 1<<24 {
		return fieldErr(join("weight"), "weight %d is too large", w)
	}
	return nil
}

func validateWorkloadGroup(m proto.Message) *FieldError {
	wg := m.(*networking.WorkloadGroup)
	if wg.GetTemplate() == nil {
		return fieldErr("template", "a template is required")
	}
	if fe := validateLabels("template.labels", wg.GetTemplate().GetLabels()); fe != nil {
		return fe
	}
	return nil
}
